"""Parse and print physical quantities.

Inside cosim every quantity is an SI float: seconds, bytes, bytes/s, FLOP/s,
hertz, watts. YAML files and the CLI take unit strings; this module is the one
place that turns them into floats and back.

Kinds and examples (case matters: ``B`` is a byte, ``b`` a bit; ``m`` milli,
``M`` mega):

=========== ===================================== ==============
kind        examples                               SI unit
=========== ===================================== ==============
bandwidth   "450 GB/s", "400 Gb/s", "25 GiB/s"     bytes/s
time        "2 us", "1.5 ms", "80 ns", "3 s"       seconds
size        "80 GiB", "4 MiB", "1.5 GB", "512 b"   bytes
flops       "989 TFLOP/s", "1.98 PFLOPS"           FLOP/s
frequency   "1.98 GHz"                             hertz
power       "700 W", "1.2 kW"                      watts
rate        "215 Mmsg/s", "200 M/s"                events/s
=========== ===================================== ==============

Decimal prefixes (k, M, G, T, P, E) are powers of 1000; binary prefixes
(Ki, Mi, Gi, Ti, Pi, Ei) powers of 1024, exactly. A bare number where a unit is
required raises :class:`UnitError` naming the field.
"""

from __future__ import annotations

import math
import re
from typing import Final, Literal

__all__ = [
    "Kind",
    "UnitError",
    "fmt",
    "fmt_bandwidth",
    "fmt_flops",
    "fmt_size",
    "fmt_time",
    "parse",
    "parse_bandwidth",
    "parse_flops",
    "parse_frequency",
    "parse_power",
    "parse_rate",
    "parse_size",
    "parse_size_list",
    "parse_time",
]

Kind = Literal["bandwidth", "time", "size", "flops", "frequency", "power", "rate"]


class UnitError(ValueError):
    """A unit string that cannot be parsed, or a bare number without a unit."""


_DEC: Final = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
_BIN: Final = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50, "Ei": 2.0**60}
_SUB: Final = {"": 1.0, "m": 1e-3, "u": 1e-6, "\u00b5": 1e-6, "\u03bc": 1e-6, "n": 1e-9, "p": 1e-12}

_NUM = r"(?P<num>[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)"
_RE = re.compile(rf"^\s*{_NUM}\s*(?P<unit>[^\s\d].*?)?\s*$")

_EXAMPLE: Final = {
    "bandwidth": "450 GB/s",
    "time": "2 us",
    "size": "80 GiB",
    "flops": "989 TFLOP/s",
    "frequency": "1.98 GHz",
    "power": "700 W",
    "rate": "215 Mmsg/s",
}


def _prefix_factor(prefix: str, allow_binary: bool = True) -> float | None:
    if prefix in _DEC:
        return _DEC[prefix]
    if allow_binary and prefix in _BIN:
        return _BIN[prefix]
    return None


def _unit_factor(kind: Kind, unit: str) -> float | None:
    """SI factor of ``unit`` for ``kind``, or None if it is not a unit of that kind."""
    u = unit.strip()
    if kind == "bandwidth":
        m = re.fullmatch(r"([KkMGTPE]i?|)(B|b|bit|byte)(?:/s|ps)", u)
        if m is None:
            return None
        f = _prefix_factor(m.group(1))
        if f is None:
            return None
        return f / 8.0 if m.group(2) in ("b", "bit") else f
    if kind == "size":
        m = re.fullmatch(r"([KkMGTPE]i?|)(B|b|bit|bits|byte|bytes)", u)
        if m is None:
            return None
        f = _prefix_factor(m.group(1))
        if f is None:
            return None
        return f / 8.0 if m.group(2) in ("b", "bit", "bits") else f
    if kind == "time":
        if u in ("min",):
            return 60.0
        if u in ("h",):
            return 3600.0
        m = re.fullmatch(r"([mun\u00b5\u03bcp]?)(s|sec)", u)
        if m is None:
            return None
        return _SUB[m.group(1)]
    if kind == "flops":
        m = re.fullmatch(r"([kKMGTPE]?)(FLOP/s|FLOPS|FLOPs|flop/s|FLOPs/s|OP/s|OPS|OPs)", u)
        return None if m is None else _DEC[m.group(1)]
    if kind == "frequency":
        m = re.fullmatch(r"([kKMGTPE]?)Hz", u)
        return None if m is None else _DEC[m.group(1)]
    if kind == "power":
        m = re.fullmatch(r"([mkKMGTPE]?)W", u)
        if m is None:
            return None
        return 1e-3 if m.group(1) == "m" else _DEC[m.group(1)]
    if kind == "rate":
        m = re.fullmatch(r"([kKMGTPE]?)(?:msg|op|ops|)(?:/s|ps)", u)
        return None if m is None else _DEC[m.group(1)]
    raise ValueError(f"unknown unit kind {kind!r}")


def parse(value: object, kind: Kind, field: str = "value") -> float:
    """Parse ``value`` (a unit string) as a quantity of ``kind``; return SI float.

    Raises:
        UnitError: bare numbers, unknown units, units of another kind, or
            negative / non-finite values. The message names ``field``.
    """
    if kind not in _EXAMPLE:
        raise ValueError(f"unknown unit kind {kind!r}")
    example = _EXAMPLE[kind]
    if isinstance(value, bool) or value is None:
        raise UnitError(f"{field}: expected a {kind} with a unit, e.g. {example!r}, got {value!r}")
    if isinstance(value, (int, float)):
        raise UnitError(f"{field}: bare number {value!r} needs a unit, e.g. {example!r}")
    if not isinstance(value, str):
        raise UnitError(f"{field}: expected a {kind} string like {example!r}, got {type(value).__name__}")
    m = _RE.match(value)
    if m is None:
        raise UnitError(f"{field}: cannot parse {value!r} as a {kind}; write it like {example!r}")
    unit = m.group("unit")
    if not unit:
        raise UnitError(f"{field}: bare number {value.strip()!r} needs a unit, e.g. {example!r}")
    factor = _unit_factor(kind, unit)
    if factor is None:
        raise UnitError(f"{field}: {unit.strip()!r} is not a {kind} unit; write it like {example!r}")
    out = float(m.group("num")) * factor
    if not math.isfinite(out) or out < 0:
        raise UnitError(f"{field}: {value!r} must be finite and non-negative")
    return out


def parse_bandwidth(value: object, field: str = "bandwidth") -> float:
    """Bandwidth string to bytes/s ("400 Gb/s" -> 5e10)."""
    return parse(value, "bandwidth", field)


def parse_time(value: object, field: str = "time") -> float:
    """Time string to seconds ("2 us" -> 2e-6)."""
    return parse(value, "time", field)


def parse_size(value: object, field: str = "size") -> float:
    """Size string to bytes ("4 MiB" -> 4194304.0)."""
    return parse(value, "size", field)


def parse_flops(value: object, field: str = "flops") -> float:
    """Throughput string to FLOP/s ("989 TFLOP/s" -> 9.89e14)."""
    return parse(value, "flops", field)


def parse_frequency(value: object, field: str = "frequency") -> float:
    """Frequency string to hertz."""
    return parse(value, "frequency", field)


def parse_power(value: object, field: str = "power") -> float:
    """Power string to watts."""
    return parse(value, "power", field)


def parse_rate(value: object, field: str = "rate") -> float:
    """Event rate string ("215 Mmsg/s") to events per second."""
    return parse(value, "rate", field)


def parse_size_list(spec: str, field: str = "sizes") -> list[float]:
    """Parse ``"1MiB,64MiB"`` (a list) or ``"1KiB:16GiB"`` (a doubling range) to bytes."""
    spec = spec.strip()
    if ":" in spec:
        lo_s, _, hi_s = spec.partition(":")
        lo, hi = parse_size(lo_s, field), parse_size(hi_s, field)
        if lo <= 0 or hi < lo:
            raise UnitError(f"{field}: range {spec!r} needs 0 < start <= end")
        out: list[float] = []
        s = lo
        while s <= hi * (1 + 1e-12):
            out.append(s)
            s *= 2
        return out
    out = [parse_size(p, field) for p in spec.split(",") if p.strip()]
    if not out:
        raise UnitError(f"{field}: empty size list; write e.g. '1MiB,64MiB' or '1KiB:16GiB'")
    return out


def _fmt(x: float, table: list[tuple[float, str]], unit: str, digits: int) -> str:
    if x == 0 or not math.isfinite(x):
        return f"{x:g} {unit}"
    ax = abs(x)
    for factor, prefix in table:
        if ax >= factor * 0.9995:
            return f"{x / factor:.{digits}g} {prefix}{unit}"
    factor, prefix = table[-1]
    return f"{x / factor:.{digits}g} {prefix}{unit}"


_DEC_TABLE = [(1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1.0, "")]
_BIN_TABLE = [(2.0**60, "Ei"), (2.0**50, "Pi"), (2.0**40, "Ti"), (2.0**30, "Gi"), (2.0**20, "Mi"), (2.0**10, "Ki"), (1.0, "")]
_TIME_TABLE = [(1.0, ""), (1e-3, "m"), (1e-6, "u"), (1e-9, "n"), (1e-12, "p")]


def fmt_bandwidth(bps: float, digits: int = 4) -> str:
    """bytes/s to a decimal string: 4.5e11 -> '450 GB/s'."""
    return _fmt(bps, _DEC_TABLE, "B/s", digits)


def fmt_size(nbytes: float, digits: int = 4, binary: bool = True) -> str:
    """bytes to a string: binary prefixes by default (2**30 -> '1 GiB')."""
    return _fmt(nbytes, _BIN_TABLE if binary else _DEC_TABLE, "B", digits)


def fmt_time(seconds: float, digits: int = 4) -> str:
    """seconds to a string: 1.5e-3 -> '1.5 ms'."""
    return _fmt(seconds, _TIME_TABLE, "s", digits)


def fmt_flops(flops: float, digits: int = 4) -> str:
    """FLOP/s to a string: 9.89e14 -> '989 TFLOP/s'."""
    return _fmt(flops, _DEC_TABLE, "FLOP/s", digits)


def fmt(value: float, kind: Kind, digits: int = 4) -> str:
    """Format an SI float of ``kind`` back into a unit string."""
    if kind == "bandwidth":
        return fmt_bandwidth(value, digits)
    if kind == "size":
        return fmt_size(value, digits)
    if kind == "time":
        return fmt_time(value, digits)
    if kind == "flops":
        return fmt_flops(value, digits)
    unit = {"frequency": "Hz", "power": "W", "rate": "/s"}[kind]
    return _fmt(value, _DEC_TABLE, unit, digits)
