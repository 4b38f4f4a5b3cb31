"""An offline tokenizer for AIPerf's synthetic prompts (run with the bench virtualenv's python).

AIPerf needs a tokenizer to cut prompts of an exact length from its corpus. The model's own tokenizer
is the right one (`--tokenizer <HF id or local dir>`), but fetching it needs the Hugging Face hub, and
AIPerf's `builtin` one downloads tiktoken's o200k_base on first use: neither works offline. This trains
a byte-level BPE (4096 tokens, ~3.5 characters a token on English, like real LLM tokenizers) on AIPerf's
own Shakespeare corpus, deterministically, in a few seconds, and saves it where transformers'
AutoTokenizer loads it. Output lengths are counted by the server either way (--use-server-token-count).

    python tools/bench_tokenizer.py DIR
"""

import json
import os
import sys

VOCAB = 4096


def build(out):
    import aiperf
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    corpus = os.path.join(os.path.dirname(aiperf.__file__), 'dataset', 'generator', 'assets', 'shakespeare.txt')
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=['<|endoftext|>'], show_progress=False)
    tok.train([corpus], trainer)
    tmp = out + '.tmp'
    os.makedirs(tmp, exist_ok=True)
    tok.save(os.path.join(tmp, 'tokenizer.json'))
    with open(os.path.join(tmp, 'tokenizer_config.json'), 'w') as f:
        json.dump({'tokenizer_class': 'PreTrainedTokenizerFast', 'model_max_length': 1 << 20,
                   'eos_token': '<|endoftext|>'}, f)
    os.rename(tmp, out)


if __name__ == '__main__':
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    if not os.path.exists(os.path.join(sys.argv[1], 'tokenizer.json')):
        build(sys.argv[1])
