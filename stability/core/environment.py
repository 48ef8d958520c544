"""The environment a run's numbers depend on, recorded beside its row.

A run is repeatable bit for bit only where everything below agrees: the libraries that
compute it (TensorFlow's kernels, Keras' layers and optimizers, NumPy's shuffles and
standardization, Hypothesis' draws of a generated data set), the thread layout that splits
its sums (``stability.train.threads``) and the CPU whose vector width and caches choose the
kernels' blocking. Each row's ``environment`` column holds ``describe()``'s one line, so a
comparison knows whether two rows can be compared exactly (``same_environment``) or only by
what must hold on any machine (``stability.report.compare``).
"""

from __future__ import annotations

import platform
import re
from functools import cache
from importlib import metadata
from pathlib import Path

#: The libraries whose versions change a run's numbers, as rows name them.
LIBRARIES = ("tensorflow", "keras", "numpy", "hypothesis")

#: CPU flags that choose TensorFlow's and oneDNN's kernels (vector width, fused multiply-add,
#: half-precision conversion): two CPUs that agree on these and on the caches run the same
#: code paths. The rest of /proc/cpuinfo's flags (virtualization, mitigations) do not.
KERNEL_FLAGS = re.compile(r"^(sse4_[12]|avx|avx2|fma|f16c|avx512\w*|avx_vnni\w*|amx\w*|sve\w*)$")

_CPUINFO = Path("/proc/cpuinfo")
_CACHES = Path("/sys/devices/system/cpu/cpu0/cache")


def version(package: str) -> str:
    """The installed version of ``package``, or ``none``."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "none"


@cache
def cpu() -> str:
    """The CPU model, its kernel-choosing flags and its cache sizes, in one line."""
    fields = _cpuinfo()
    model = fields.get("model name") or fields.get("Processor") or platform.processor()
    model = " ".join((model or platform.machine() or "unknown").split())
    ident = "/".join(fields[k] for k in ("cpu family", "model", "stepping") if k in fields)
    flags = sorted(
        f
        for f in (fields.get("flags") or fields.get("Features", "")).split()
        if KERNEL_FLAGS.match(f)
    )
    parts = [model, platform.machine()]
    if ident:
        parts.append(f"family/model/stepping {ident}")
    if flags:
        parts.append("flags " + ",".join(flags))
    caches = _caches()
    if caches:
        parts.append("caches " + ",".join(caches))
    return "; ".join(parts)


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (empty where there is none)."""
    fields: dict[str, str] = {}
    try:
        text = _CPUINFO.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return fields
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def _caches() -> list[str]:
    """``L1d 32K``-style sizes of the first CPU's caches, from sysfs (empty elsewhere)."""
    found = []
    for index in sorted(_CACHES.glob("index*")):
        try:
            level = (index / "level").read_text().strip()
            kind = (index / "type").read_text().strip()
            size = (index / "size").read_text().strip()
        except OSError:
            continue
        suffix = {"Data": "d", "Instruction": "i"}.get(kind, "")
        found.append(f"L{level}{suffix} {size}")
    return found


def short_cpu(text: str) -> str:
    """``cpu()``'s line cut to the CPU's model and family/model/stepping (``AMD EPYC
    25/1/1``), or the whole line where it has no such identity."""
    parts = text.split("; ")
    ident = next((p.split(" ", 1)[1] for p in parts if p.startswith("family/model/stepping ")), "")
    return f"{parts[0]} {ident}".strip() if ident else text


def describe(threads: str) -> str:
    """The environment of a run trained on ``threads`` (``1x1``), as its row records it:
    ``tensorflow 2.21.0, keras 3.15.1, numpy 2.4.6, hypothesis 6.170.17, python 3.11.7,
    threads 1x1, cpu AMD EPYC; x86_64; ...``."""
    libraries = ", ".join(f"{name} {version(name)}" for name in LIBRARIES)
    return f"{libraries}, python {platform.python_version()}, threads {threads}, cpu {cpu()}"


def parse(text: str) -> dict[str, str]:
    """``describe``'s line back as {fact: value}; empty for a row that has none."""
    facts: dict[str, str] = {}
    head, _, cpu_text = (text or "").partition(", cpu ")
    for part in head.split(", "):
        name, _, value = part.strip().partition(" ")
        if name and value:
            facts[name] = value
    if cpu_text:
        facts["cpu"] = cpu_text
    return facts


def differences(a: str, b: str) -> list[str]:
    """The facts two environments differ in (``tensorflow 2.16.2 vs 2.21.0``); a missing
    environment (rows written before the column) differs in ``environment``."""
    if not a or not b:
        return ["environment not recorded"]
    left, right = parse(a), parse(b)
    return [
        f"{name} {left.get(name, '-')} vs {right.get(name, '-')}"
        for name in dict.fromkeys([*left, *right])
        if left.get(name) != right.get(name)
    ]


def same_environment(a: str, b: str) -> bool:
    """Whether rows made in ``a`` and ``b`` can be compared exactly."""
    return bool(a) and a == b
