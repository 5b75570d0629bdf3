"""The dry run's import check (scripts/gpu_wheels.sh --dry-run): with only the carried wheels and kfactory
(SITE) and the packages the device image has (IMAGE) on the path, import everything scripts/gpu_check.sh
imports: every kfactory module, scripts/gpu_check.py, gpu_check_kda.py and gpu_warm_baselines.py, and the GPU
tests as pytest collects them (with its plugins and gpu_check.sh's flags). Run with `python3.12 -S` (no
site-packages of this machine).

Usage: python3.12 -S scripts/gpu_imports.py SITE IMAGE ROOT   (ROOT holds copies of scripts/, tests/ and
pyproject.toml). Exit 1 when a module is missing that neither the wheels nor the image provide.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import pkgutil
import sys
import traceback

#: what the device image has and this machine's dry run does not install (too large to fetch for a check)
DEVICE_ONLY = {"torch", "triton"}


def main() -> int:
    site, image, root = sys.argv[1:4]
    sys.path[:0] = [site, image, f"{root}/scripts"]
    missing: list[str] = []
    device_only: list[str] = []

    def attempt(name: str) -> None:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            top = (e.name or "").split(".")[0]
            (device_only if top in DEVICE_ONLY else missing).append(f"{name}: no module {e.name!r}")
        except Exception:  # noqa: BLE001 - any other failure to import is a failure of the check
            missing.append(f"{name}: {traceback.format_exc(limit=3).strip().splitlines()[-1]}")

    import kfactory
    assert kfactory.__path__[0].startswith(site), f"kfactory imported from {kfactory.__path__}, not {site}"
    modules = ["kfactory"] + [m.name for m in pkgutil.walk_packages(kfactory.__path__, "kfactory.",
                                                                    onerror=lambda n: missing.append(n))]
    for name in modules + ["gpu_check", "gpu_check_kda", "gpu_warm_baselines"]:
        attempt(name)
    for dist in ("fla-core",):  # the KDA baselines: installed, imported on the device (they need torch)
        try:
            importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            missing.append(f"{dist}: not installed")
    attempt("fla")
    import pytest
    # the GPU tests as gpu_check.sh runs them: collected (imported, with their conftest and plugins), not run
    rc = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "--timeout", "120", "-m", "gpu",
                      "--rootdir", root, f"{root}/tests/test_cuda_runtime.py"])
    if rc not in (0, 5):  # 5: nothing selected is fine, an import error is not
        missing.append(f"pytest could not collect tests/test_cuda_runtime.py (exit {int(rc)})")
    print(f"imported {len(modules) + 2} modules with the carried wheels and the image's packages alone")
    for line in device_only:
        print(f"  on the device only (needs the image's {'/'.join(sorted(DEVICE_ONLY))}): {line}")
    for line in missing:
        print(f"  MISSING {line}")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
