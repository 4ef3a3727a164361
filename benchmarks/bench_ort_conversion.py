"""A model's conversion from a template against the engine's converter: ONNX Runtime GenAI's model
builder (`--engine ort`, the default) or optimum-intel's OpenVINO export (`--engine ov`).

The first model is converted by the converter, which records it as the template of its architecture
(toolkit.rollouts.conversions). Every further model is then converted twice: by the converter into a
fresh cache (the baseline) and from the template; the script prints both times, their ratio, and
whether every file of the two conversions is the same byte for byte.

    .venv/bin/python benchmarks/bench_ort_conversion.py [--engine ov] TEMPLATE_MODEL MODEL [MODEL ...]

The models are model folders (e.g. a recipe's stages' `model/` folders) or named models.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
import time
from pathlib import Path

from recipe_runs import ROOT, table_header, table_row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("template")
    ap.add_argument("models", nargs="+")
    ap.add_argument("--engine", choices=["ort", "ov"], default="ort")
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from pipeline.models.named import resolve_model
    from pipeline.store.home import configure_environment
    from toolkit.core import files
    from toolkit.rollouts import ort, ov

    configure_environment()
    engine = {"ort": ort, "ov": ov}[a.engine]
    def convert(model: str) -> Path:
        return ort.converted(model, "float32") if a.engine == "ort" else ov.converted(model)

    work = Path(tempfile.mkdtemp(prefix=f"bench-{a.engine}-conversion-"))
    try:
        engine.keep_conversions_in(work / "templated")
        started = time.perf_counter()
        convert(str(resolve_model(a.template)))
        print(f"template: {a.template}, converted by the converter in {time.perf_counter() - started:.1f} s\n")
        print(table_header("model", "converter s (baseline)", "from the template s", "ratio", "files the same"))
        for i, name in enumerate(a.models):
            model = str(resolve_model(name))
            engine.keep_conversions_in(work / f"builder-{i}")
            files._FINGERPRINTS.clear()  # each way pays for hashing the weights, as a fresh worker does
            started = time.perf_counter()
            by_builder = convert(model)
            builder_s = time.perf_counter() - started
            engine.keep_conversions_in(work / "templated")
            files._FINGERPRINTS.clear()
            started = time.perf_counter()
            templated = convert(model)
            template_s = time.perf_counter() - started
            names = sorted(p.name for p in by_builder.iterdir())
            same = filecmp.cmpfiles(by_builder, templated, names, shallow=False)[0]
            same_names = names == sorted(p.name for p in templated.iterdir())
            print(table_row(name, f"{builder_s:.1f}", f"{template_s:.1f}", f"{template_s / builder_s:.2f}",
                            f"{len(same)} of {len(names)}" + ("" if same_names else " (other file names)")), flush=True)
            shutil.rmtree(work / f"builder-{i}")
    finally:
        engine.keep_conversions_in(None)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
