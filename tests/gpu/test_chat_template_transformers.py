"""The public chat templates rendered by rlserve against transformers' own apply_chat_template
(the GPU machine has transformers; CI has only jinja2, which
tests/python/test_chat_template_parity.py configures as transformers does). The same templates,
conversations and keyword arguments as that test; only the reference changes: a transformers
tokenizer holding the model's special tokens renders each request with tokenize=False.
Needs RLSERVE_BIN (any build: rendering runs on the CPU)."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
import test_chat_template_parity as parity  # noqa: E402

import transformers  # noqa: E402
from tokenizers import Tokenizer, models  # noqa: E402
from transformers import PreTrainedTokenizerFast  # noqa: E402


def transformers_reference(template, request, special_tokens):
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE()), **special_tokens)
    try:
        return tok.apply_chat_template(request["messages"], tools=request.get("tools"), chat_template=template,
                                       tokenize=False, add_generation_prompt=request.get("add_generation_prompt", True),
                                       **request.get("kwargs", {}))
    except Exception:  # noqa: BLE001 - any failure of the template is "transformers refuses"
        return None


if __name__ == "__main__":
    print(f"reference: transformers {transformers.__version__}")
    parity.reference = transformers_reference
    parity.main()
