#!/usr/bin/env python3
"""Where code outside the model families names one: the measure of "one family, one place".

    python3 scripts/family-names.py           # each identifier naming a family outside src/models and
                                              # include/fsdp/models, and the counts
    python3 scripts/family-names.py --check   # exit 1 naming each one not in DATA_FORMATS

The families are those registered (each src/models/*_family.cpp's name(): gpt, llama, qwen2, ...),
matched by stem (qwen2 -> qwen) against the words of every identifier in the code of src/, apps/
and include/ (comments and string literals left out: a comment may say "an 8 B Llama's embedding",
a help text may give an example config). An identifier's words are split at '_' and at a capital
(Gpt2BpeTokenizer -> gpt2, bpe, tokenizer). DATA_FORMATS lists the names that call a file format
or a template after the vendor that made it, not a model family (the GPT-2 tokenizer's vocab.json
and merges.txt, Llama 3's chat template): any data may use them with any family. An enumerator is
listed with its enum (ChatFormat::Mistral, also where its enum declares it), so that a bare
`Mistral` elsewhere still counts.
"""
import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Identifiers named after a data format, not a model family, and why.
DATA_FORMATS = {
    "TokenizerKind::Gpt2": "data.tokenizer = \"gpt2\": the GPT-2 BPE tokenizer's files (vocab.json, merges.txt)",
    "Gpt2BpeTokenizer": "the tokenizer that reads those files",
    "gpt2_regex": "that tokenizer's pre-tokenizing pattern",
    "kGpt2SplitPattern": "the pattern's text, which Hugging Face byte-level tokenizers share",
    "ChatFormat::Llama3": "data.chat_format = \"llama3\": Llama 3's chat template",
    "llama3_header": "that template's turn header",
    "ChatFormat::Mistral": "data.chat_format = \"mistral\": Mistral's [INST] chat template",
    "mistral_text": "that template's text",
    "ChatFormat::Gemma": "data.chat_format = \"gemma\": Gemma's <start_of_turn> chat template",
    "gemma_text": "that template's text",
}
# Words that are a family's name but mean something else here.
OTHER_MEANINGS = {"clip": ("grad_clip", "clip_grad", "clipping", "clipped", "clip_coef", "clip_")}


def families():
    names = set()
    for path in (ROOT / "src" / "models").glob("*_family.cpp"):
        names.update(re.findall(r'name\(\) const override \{ return "([a-z0-9]+)"; \}', path.read_text()))
    if not names:
        sys.exit("family-names: no registered family found in src/models/*_family.cpp")
    return sorted({name.rstrip("0123456789") for name in names})


def code_only(text):
    """The text with comments and string and character literals blanked, lines kept."""
    pattern = re.compile(r'//[^\n]*|/\*.*?\*/|R"([^(]*)\(.*?\)\1"|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)
    return pattern.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def words(identifier):
    parts = []
    for piece in identifier.split("_"):
        parts += re.findall(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])", piece)
    return [p.lower().rstrip("0123456789") for p in parts if p]


def uses(stems):
    """(path, line number, name) for each name in code naming a family: an identifier, or an
    enumerator as ENUM::NAME."""
    found = []
    families_own = (ROOT / "src" / "models", ROOT / "include" / "fsdp" / "models")
    for folder in ("src", "apps", "include"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix not in (".h", ".cpp", ".cu") or any(own in path.parents for own in families_own):
                continue
            for number, line in enumerate(code_only(path.read_text()).split("\n"), 1):
                declared = re.search(r"enum\s+class\s+(\w+)", line)  # its enumerators, unqualified
                for qualified in re.findall(r"[A-Za-z_]\w*(?:::[A-Za-z_]\w*)*", line):
                    parts = qualified.split("::")
                    for i, identifier in enumerate(parts):
                        named = [w for w in words(identifier) if w in stems]
                        if any(w == "clip" for w in named) and any(o in identifier.lower() for o in OTHER_MEANINGS["clip"]):
                            continue
                        if not named:
                            continue
                        owner = parts[i - 1] if i > 0 else (declared.group(1) if declared else "")
                        name = f"{owner}::{identifier}" if f"{owner}::{identifier}" in DATA_FORMATS else identifier
                        found.append((path.relative_to(ROOT), number, name))
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 on an identifier not in DATA_FORMATS")
    args = parser.parse_args()
    stems = families()
    found = uses(stems)
    families_named = [f for f in found if f[2] not in DATA_FORMATS]
    for path, number, identifier in found:
        why = DATA_FORMATS.get(identifier)
        print(f"{path}:{number}: {identifier}" + (f"  (data format: {why})" if why else "  NAMES A FAMILY"))
    print(f"family-names: families {', '.join(stems)}; outside src/models and include/fsdp/models, "
          f"{len(found)} identifier uses in code, {len(found) - len(families_named)} of them data formats, "
          f"{len(families_named)} naming a family")
    if args.check and families_named:
        print("family-names: FAILED: code outside the families names one; ask the family's spec "
              "(models::ModelFamily) instead, or add a data format to DATA_FORMATS with why")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
