"""Unit strings to SI floats and back (cosim.units)."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cosim import units
from cosim.units import UnitError


class TestPrefixes:
    @pytest.mark.parametrize(
        ("text", "expected"),
        [
            ("1 B", 1.0),
            ("1 KiB", 2.0**10),
            ("1 MiB", 2.0**20),
            ("1 GiB", 2.0**30),
            ("1 TiB", 2.0**40),
            ("80 GiB", 80 * 2.0**30),
            ("1 kB", 1e3),
            ("1 KB", 1e3),
            ("1 MB", 1e6),
            ("1 GB", 1e9),
            ("1.5 GB", 1.5e9),
            ("1 TB", 1e12),
            ("2 PB", 2e15),
        ],
    )
    def test_size_decimal_vs_binary_exact(self, text: str, expected: float) -> None:
        assert units.parse_size(text) == expected

    def test_gib_and_gb_differ(self) -> None:
        # 2**30 / 1e9 = 1.073741824
        assert units.parse_size("1 GiB") / units.parse_size("1 GB") == 1.073741824

    def test_no_space_and_whitespace(self) -> None:
        assert units.parse_size("4MiB") == 4 * 2**20
        assert units.parse_size("  4 MiB  ") == 4 * 2**20

    def test_case_matters(self) -> None:
        # m is milli, M mega; lowercase "ki" is not a binary prefix.
        assert units.parse_time("1 ms") == 1e-3
        with pytest.raises(UnitError):
            units.parse_size("1 kiB")


class TestBitsAndBytes:
    def test_bandwidth_bits(self) -> None:
        # 400 Gb/s = 400e9 bit/s / 8 = 50e9 B/s
        assert units.parse_bandwidth("400 Gb/s") == 50e9
        assert units.parse_bandwidth("400 Gbps") == 50e9
        assert units.parse_bandwidth("400 Gbit/s") == 50e9

    def test_bandwidth_bytes(self) -> None:
        assert units.parse_bandwidth("450 GB/s") == 450e9
        assert units.parse_bandwidth("3.35 TB/s") == pytest.approx(3.35e12, rel=1e-15)
        assert units.parse_bandwidth("25 GiB/s") == 25 * 2.0**30
        assert units.parse_bandwidth("64 GBps") == 64e9

    def test_size_bits(self) -> None:
        # 512 bits = 64 bytes
        assert units.parse_size("512 b") == 64.0
        assert units.parse_size("1 Kib") == 128.0


class TestOtherKinds:
    @pytest.mark.parametrize(
        ("text", "expected"),
        [
            ("2 us", 2e-6),
            ("2 µs", 2e-6),
            ("2 μs", 2e-6),
            ("1.5 ms", 1.5e-3),
            ("80 ns", 80e-9),
            ("500 ps", 500e-12),
            ("3 s", 3.0),
            ("3 sec", 3.0),
            ("2 min", 120.0),
            ("1 h", 3600.0),
        ],
    )
    def test_time(self, text: str, expected: float) -> None:
        assert units.parse_time(text) == pytest.approx(expected, rel=1e-15)

    def test_flops(self) -> None:
        assert units.parse_flops("989 TFLOP/s") == 989e12
        assert units.parse_flops("989.4 TFLOP/s") == pytest.approx(989.4e12, rel=1e-15)
        assert units.parse_flops("1.98 PFLOPS") == pytest.approx(1.98e15, rel=1e-15)
        assert units.parse_flops("19.5 Tflop/s") == pytest.approx(19.5e12, rel=1e-15)

    def test_frequency_power_rate(self) -> None:
        assert units.parse_frequency("1.98 GHz") == pytest.approx(1.98e9, rel=1e-15)
        assert units.parse_power("700 W") == 700.0
        assert units.parse_power("1.2 kW") == pytest.approx(1200.0, rel=1e-15)
        assert units.parse_rate("215 Mmsg/s") == 215e6
        assert units.parse_rate("200 M/s") == 200e6

    def test_parse_by_kind(self) -> None:
        assert units.parse("8 TB/s", "bandwidth") == 8e12
        assert units.parse("80 GiB", "size") == 80 * 2**30

    def test_exponent_numbers(self) -> None:
        assert units.parse_bandwidth("6.4e10 B/s") == 6.4e10
        assert units.parse_size(".5 KiB") == 512.0


class TestErrors:
    @pytest.mark.parametrize("value", [450, 450.0, "450", " 450 "])
    def test_bare_number_names_the_field(self, value: object) -> None:
        with pytest.raises(UnitError) as exc:
            units.parse_bandwidth(value, "links[3].bandwidth")
        msg = str(exc.value)
        assert msg.startswith("links[3].bandwidth: bare number")
        assert "needs a unit" in msg and "450 GB/s" in msg

    def test_wrong_kind_of_unit(self) -> None:
        with pytest.raises(UnitError, match=r"hbm_bandwidth: 'GiB' is not a bandwidth unit"):
            units.parse_bandwidth("80 GiB", "hbm_bandwidth")
        with pytest.raises(UnitError, match="is not a time unit"):
            units.parse_time("5 GB")
        with pytest.raises(UnitError, match="is not a flops unit"):
            units.parse_flops("989 TB/s")

    @pytest.mark.parametrize("value", ["fast", "", "GB/s", "1..2 GB", "nan GB/s"])
    def test_garbage(self, value: str) -> None:
        with pytest.raises(UnitError, match="bw: "):
            units.parse_bandwidth(value, "bw")

    @pytest.mark.parametrize("value", [None, True, ["1 GB"], {"a": 1}])
    def test_wrong_types(self, value: object) -> None:
        with pytest.raises(UnitError, match=r"^size: "):
            units.parse_size(value)

    def test_negative_and_infinite(self) -> None:
        with pytest.raises(UnitError, match="non-negative"):
            units.parse_time("-2 us")
        with pytest.raises(UnitError, match="finite"):
            units.parse_size("1e400 B")

    def test_unit_error_is_value_error(self) -> None:
        assert issubclass(UnitError, ValueError)

    def test_unknown_kind(self) -> None:
        # A programming error, not user input. units.parse looks the kind up in
        # _EXAMPLE before _unit_factor's ValueError, so today it is a KeyError
        # (reported to the lead); either is fine here.
        with pytest.raises((KeyError, ValueError)):
            units.parse("1 GB", "weight")  # type: ignore[arg-type]


class TestSizeList:
    def test_list(self) -> None:
        assert units.parse_size_list("1MiB,64MiB") == [2.0**20, 64 * 2.0**20]
        assert units.parse_size_list(" 1 KiB , 2 KiB ,") == [1024.0, 2048.0]

    def test_doubling_range(self) -> None:
        sizes = units.parse_size_list("1KiB:16GiB")
        # 2**10 .. 2**34 doubling: 25 sizes
        assert len(sizes) == 25
        assert sizes[0] == 2**10 and sizes[-1] == 2**34
        assert all(b == 2 * a for a, b in itertools.pairwise(sizes))

    def test_range_stops_at_end(self) -> None:
        assert units.parse_size_list("1KiB:3KiB") == [1024.0, 2048.0]
        assert units.parse_size_list("4KiB:4KiB") == [4096.0]

    def test_bad_range(self) -> None:
        with pytest.raises(UnitError, match="sizes: range"):
            units.parse_size_list("16GiB:1KiB")
        with pytest.raises(UnitError, match="0 < start"):
            units.parse_size_list("0B:1KiB")
        with pytest.raises(UnitError, match="bare number"):
            units.parse_size_list("1:16", "sizes")


class TestFormat:
    def test_examples(self) -> None:
        assert units.fmt_bandwidth(4.5e11) == "450 GB/s"
        assert units.fmt_size(2**30) == "1 GiB"
        assert units.fmt_size(1e9, binary=False) == "1 GB"
        assert units.fmt_time(1.5e-3) == "1.5 ms"
        assert units.fmt_time(2e-6) == "2 us"
        assert units.fmt_flops(9.89e14) == "989 TFLOP/s"
        assert units.fmt(1.98e9, "frequency") == "1.98 GHz"
        assert units.fmt(700.0, "power") == "700 W"
        assert units.fmt(0.0, "time") == "0 s"

    @pytest.mark.parametrize(
        ("kind", "value"),
        [
            ("bandwidth", 4.5e11),
            ("bandwidth", 5e10),
            ("size", 80 * 2**30),
            ("size", 512.0),
            ("time", 4.8e-6),
            ("time", 3600.0),
            ("flops", 989.4e12),
            ("frequency", 1.755e9),
            ("power", 1200.0),
            ("rate", 215e6),
        ],
    )
    def test_round_trip_examples(self, kind: units.Kind, value: float) -> None:
        assert units.parse(units.fmt(value, kind), kind) == pytest.approx(value, rel=1e-12)

    @given(
        kind=st.sampled_from(["bandwidth", "size", "time", "flops"]),
        value=st.floats(min_value=1e-9, max_value=1e17, allow_nan=False, allow_infinity=False),
    )
    def test_round_trip_within_printed_digits(self, kind: units.Kind, value: float) -> None:
        # fmt keeps 4 significant digits, so the round trip is within 5e-4.
        back = units.parse(units.fmt(value, kind), kind)
        assert math.isclose(back, value, rel_tol=5e-4)

    def test_more_digits(self) -> None:
        assert units.fmt_flops(989.4e12, digits=6) == "989.4 TFLOP/s"
