"""The measurement behind the ``("float32", "lora-train:torch:tf")`` bound of `shared.tolerances`.

LoRA fine-tuning of the same float32 model in torch_impl (a PEFT-style wrapper on every projection,
its kernel frozen) and tf_impl (``Dense.enable_lora``), Adam + Noam on copy batches, dropout 0
(`parity_tests.adapters.lora_training_differences`): prints, per variant and seed, the largest
scaled difference over every step of the losses, the LoRA factors and the projections' biases
(and how far the factors moved from their start, to show they trained).
Not a test (pytest does not collect it); rerun by hand:

    PYTHONPATH=$PWD .venv/bin/python -m parity_tests.measure_lora_bounds [--seeds 3] [--steps 20]
"""
from __future__ import annotations

import argparse

from parity_tests.adapters import lora_training_differences

VARIANTS = ["tiny-pre-annotated", "tiny-post-standard", "tiny-shared-tied-post"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args(argv)
    import torch
    torch.set_num_threads(1)  # tiny models: one thread is faster and deterministic
    overall: dict[str, float] = {}
    for variant in VARIANTS:
        for seed in range(args.seeds):
            worst: dict[str, float] = {}
            for step in lora_training_differences(variant, seed, args.steps):
                for key, value in step.items():
                    worst[key] = max(worst.get(key, 0.0), value)
            print(variant, f"seed {seed}:", "  ".join(f"{k} {v:.2e}" for k, v in worst.items()), flush=True)
            for key, value in worst.items():
                overall[key] = max(overall.get(key, 0.0), value)
    print("largest:", "  ".join(f"{k} {v:.2e}" for k, v in overall.items()))


if __name__ == "__main__":
    main()
