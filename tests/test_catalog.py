"""The bundled hardware catalog, its loader, extends, overrides and errors."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from pydantic import ValidationError

from cosim.catalog import DATA_DIR, SECTIONS, Accelerator, Catalog, LinkType, load_catalog
from cosim.errors import CosimInputError
from cosim.yamlio import loads_yaml

GB = 1e9
TFLOPS = 1e12
PFLOPS = 1e15
GiB = 2**30
US = 1e-6

REQUIRED = {
    "accelerators": {"h100-sxm5", "h100-pcie", "h800-sxm5", "h200-sxm", "a100-sxm-80gb", "b200", "gb200",
                     "b300", "mi300x", "l40s", "v100-sxm2-32gb", "custom"},
    "cpus": {"xeon-8480c", "epyc-9654", "grace", "epyc-7742", "xeon-e5-2698v4", "xeon-8570"},
    "nics": {"cx6-hdr200", "cx7-ndr400", "bluefield3", "cx8-xdr800"},
    "links": {"pcie3x16", "pcie4x16", "pcie5x16", "pcie6x16", "nvlink2", "nvlink3", "nvlink4", "nvlink5",
              "nvlink-c2c", "upi", "xgmi", "ib-hdr", "ib-ndr", "ib-xdr", "eth-400g", "eth-800g"},
}


@pytest.fixture(scope="module")
def cat() -> Catalog:
    return load_catalog()


def write(tmp_path: Path, text: str, name: str = "parts.yaml") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
    return p


def load_error(tmp_path: Path, text: str) -> str:
    p = write(tmp_path, text)
    with pytest.raises(CosimInputError) as exc:
        load_catalog(extra=[p])
    msg = str(exc.value)
    assert "\n" not in msg
    return msg.replace(str(p), "parts.yaml")


# --------------------------------------------------------------------------- bundled data


class TestBundled:
    def test_required_ids(self, cat: Catalog) -> None:
        for section, ids in REQUIRED.items():
            assert ids <= set(cat.section(section)), section

    def test_every_entry_is_sourced_and_positive(self, cat: Catalog) -> None:
        for section in SECTIONS:
            for key, entry in cat.section(section).items():
                assert len(entry.source) > 10, key
                assert entry.name, key
        for key, acc in cat.accelerators.items():
            assert acc.hbm_bandwidth > 0 and acc.hbm_capacity > 0, key
            assert acc.peak("bf16") > acc.peak("fp32") > 0, key
        for key, link in cat.links.items():
            assert 0 < link.effective_bandwidth <= link.bandwidth, key

    def test_data_ships_inside_the_package(self) -> None:
        assert DATA_DIR.parent.name == "catalog" and DATA_DIR.parent.parent.name == "cosim"
        for section in SECTIONS:
            assert (DATA_DIR / f"{section}.yaml").is_file()

    def test_cached_and_immutable(self, cat: Catalog) -> None:
        assert load_catalog() is cat
        with pytest.raises(TypeError):
            cat.accelerators["x"] = cat.accelerator("h100-sxm5")  # type: ignore[index]
        with pytest.raises(ValidationError):
            cat.accelerator("h100-sxm5").tdp = 1.0  # type: ignore[misc]

    def test_only_custom_is_hypothetical(self, cat: Catalog) -> None:
        assert [k for k, a in cat.accelerators.items() if a.hypothetical] == ["custom"]


class TestHandChecked:
    def test_h100_sxm5(self, cat: Catalog) -> None:
        h = cat.accelerator("h100-sxm5")
        # bf16 dense = 132 SMs x 4096 FLOP/clk x 1.83 GHz = 989.4 TFLOP/s (1979 with sparsity)
        assert h.peak_flops["bf16"] == pytest.approx(989.4 * TFLOPS)
        assert h.peak("fp8") == pytest.approx(1978.9 * TFLOPS)
        assert h.hbm_capacity == 80 * GiB
        assert h.hbm_bandwidth == pytest.approx(3.35e12)
        assert h.l2_size == 50 * 2**20
        assert h.tdp == 700
        # NVLink 4: 18 links x 25 GB/s = 450 GB/s per direction (900 GB/s "bidirectional")
        assert h.scale_up is not None and h.scale_up.link == "nvlink4"
        assert h.scale_up.links == 18 and h.scale_up.bandwidth == 25 * GB
        assert h.scale_up.total_bandwidth == 450 * GB
        assert cat.link(h.pcie.link).bandwidth == 64 * GB

    def test_a100_nvlink3(self, cat: Catalog) -> None:
        a = cat.accelerator("a100-sxm-80gb")
        # 12 x 25 GB/s = 300 GB/s per direction
        assert a.scale_up is not None and a.scale_up.total_bandwidth == 300 * GB
        assert a.peak_flops["bf16"] == 312 * TFLOPS
        assert a.pcie.link == "pcie4x16"

    def test_b200_nvlink5(self, cat: Catalog) -> None:
        b = cat.accelerator("b200")
        # 18 x 50 GB/s = 900 GB/s per direction (1.8 TB/s both)
        assert b.scale_up is not None and b.scale_up.link == "nvlink5"
        assert b.scale_up.total_bandwidth == 900 * GB
        # HGX B200 36 PFLOPS sparse bf16 / 8 GPUs / 2 = 2.25 PFLOP/s dense
        assert b.peak_flops["bf16"] == 2.25 * PFLOPS
        assert b.peak("fp4") == 9 * PFLOPS

    def test_links(self, cat: Catalog) -> None:
        # PCIe 5.0 x16: 32 GT/s x 16 lanes / 8 = 64 GB/s raw; 55.63 GB/s measured
        p5 = cat.link("pcie5x16")
        assert p5.bandwidth == 64 * GB
        assert p5.effective_bandwidth == pytest.approx(55.68 * GB)  # 64 x 0.87
        assert cat.link("pcie4x16").bandwidth == 32 * GB
        assert cat.link("nvlink4").bandwidth == 25 * GB
        assert cat.link("nvlink5").bandwidth == 50 * GB
        # "900 GB/s" bidirectional -> 450 GB/s per direction
        assert cat.link("nvlink-c2c").bandwidth == 450 * GB
        # 400 Gb/s / 8 = 50 GB/s
        assert cat.link("ib-ndr").bandwidth == 50 * GB
        assert cat.link("ib-xdr").bandwidth == 100 * GB

    def test_mi300x_xgmi_bidirectional(self, cat: Catalog) -> None:
        m = cat.accelerator("mi300x")
        # 128 GB/s bidirectional per link -> 64 GB/s; 7 links -> 448 GB/s per direction
        assert m.scale_up is not None and m.scale_up.bandwidth == 64 * GB
        assert m.scale_up.total_bandwidth == 448 * GB
        assert m.hbm_capacity == 192 * GiB

    def test_pcie_only_parts(self, cat: Catalog) -> None:
        assert cat.accelerator("h100-pcie").scale_up is None
        assert cat.accelerator("l40s").scale_up is None

    def test_v100_fallbacks(self, cat: Catalog) -> None:
        v = cat.accelerator("v100-sxm2-32gb")
        assert "bf16" not in v.peak_flops
        # no bf16 / fp8 units: both run at the fp16 tensor rate
        assert v.peak("bf16") == v.peak("fp8") == 125 * TFLOPS
        assert v.peak("tf32") == v.peak_flops["fp32"]

    def test_nics(self, cat: Catalog) -> None:
        cx7 = cat.nic("cx7-ndr400")
        assert cx7.bandwidth == 50 * GB and cx7.link == "ib-ndr" and cx7.gpudirect_rdma
        assert cat.nic("cx6-hdr200").bandwidth == 25 * GB
        assert cat.nic("cx8-xdr800").bandwidth == 100 * GB
        assert cx7.per_message_overhead == pytest.approx(1 / cx7.message_rate, rel=0.01)

    def test_cpu_launch_costs_from_traces(self, cat: Catalog) -> None:
        # TraceLens H100 (EPYC 9654 host): cudaLaunchKernel median 3.3-4.9 us; kernel starts >= 4.8 us later
        epyc = cat.cpu("epyc-9654")
        assert 3.3 * US <= epyc.launch_overhead <= 4.9 * US
        assert epyc.launch_latency >= 4.8 * US
        assert 6 * US <= cat.cpu("epyc-7742").launch_overhead <= 10 * US  # A100 hosts
        assert 5 * US <= cat.cpu("xeon-e5-2698v4").launch_overhead <= 6 * US  # V100 hosts
        assert cat.cpu("xeon-8480c").memory_bandwidth == pytest.approx(307.2 * GB)  # 8 x 4800 MT/s x 8 B
        assert cat.cpu("xeon-8480c").sockets == 2 and cat.cpu("xeon-8480c").cores == 56  # DGX H100: 2 x 56 cores


# --------------------------------------------------------------------------- extends


class TestExtends:
    def test_h800_derives_from_h100(self, cat: Catalog) -> None:
        h100, h800 = cat.accelerator("h100-sxm5"), cat.accelerator("h800-sxm5")
        assert h800.peak_flops["fp64"] == 1 * TFLOPS
        assert h800.peak_flops["bf16"] == h100.peak_flops["bf16"]  # merged, not replaced
        # 8 NVLink 4 links x 25 GB/s = 200 GB/s per direction (400 GB/s both)
        assert h800.scale_up is not None and h800.scale_up.links == 8
        assert h800.scale_up.link == "nvlink4" and h800.scale_up.total_bandwidth == 200 * GB
        assert h800.hbm_capacity == h100.hbm_capacity and h800.name != h100.name
        assert "DeepSeek" in h800.sources["notes"]

    def test_h200_and_gb200(self, cat: Catalog) -> None:
        assert cat.accelerator("h200-sxm").hbm_bandwidth == 4.8e12
        assert cat.accelerator("h200-sxm").sm_count == 132
        gb = cat.accelerator("gb200")
        assert gb.host_link == "nvlink-c2c" and gb.scale_up == cat.accelerator("b200").scale_up

    def test_user_entry_extends_and_records_provenance(self, tmp_path: Path, cat: Catalog) -> None:
        p = write(tmp_path, """
            accelerators:
              fast-h100:
                extends: h100-sxm5
                hbm_bandwidth: "8 TB/s"
                scale_up: {bidirectional: "1.8 TB/s"}
              faster:
                extends: fast-h100
                peak_flops: {bf16: "2 PFLOP/s", fp64: null}
        """)
        c = load_catalog(extra=[p])
        fast = c.accelerator("fast-h100")
        assert fast.hbm_bandwidth == 8e12 and fast.name == "fast-h100"
        # per link 1.8 TB/s both ways -> 900 GB/s per direction; the 18 links are inherited
        assert fast.scale_up is not None and fast.scale_up.bandwidth == 900 * GB and fast.scale_up.links == 18
        assert fast.source == cat.accelerator("h100-sxm5").source
        assert fast.sources["hbm_bandwidth"] == f"set in {p}:4"
        faster = c.accelerator("faster")
        assert faster.peak_flops["bf16"] == 2 * PFLOPS and "fp64" not in faster.peak_flops
        assert faster.hbm_bandwidth == 8e12
        assert "fast-h100" not in cat.accelerators  # the bundled catalog is untouched

    def test_cycle(self, tmp_path: Path) -> None:
        msg = load_error(tmp_path, """
            accelerators:
              a:
                extends: b
              b:
                extends: a
        """)
        assert msg == "parts.yaml:5:14: accelerators.b.extends: extends cycle: a -> b -> a"

    def test_self_cycle(self, tmp_path: Path) -> None:
        msg = load_error(tmp_path, """
            links:
              me:
                extends: me
        """)
        assert msg == "parts.yaml:3:14: links.me.extends: extends cycle: me -> me"

    def test_unknown_target(self, tmp_path: Path) -> None:
        msg = load_error(tmp_path, """
            accelerators:
              a:
                extends: h100-sxm6
        """)
        assert msg.startswith("parts.yaml:3:14: accelerators.a.extends: unknown accelerator 'h100-sxm6' "
                              "(did you mean 'h100-sxm5'")
        assert "; known: a, a100-sxm-80gb, b200," in msg


# --------------------------------------------------------------------------- lookups, overrides, entries


class TestApi:
    def test_unknown_id_suggests(self, cat: Catalog) -> None:
        with pytest.raises(CosimInputError) as exc:
            cat.accelerator("h1000")
        msg = str(exc.value)
        assert msg.startswith("unknown accelerator 'h1000' (did you mean 'h100-sxm5'")
        assert "known: a100-sxm-80gb, b200, b300, custom," in msg
        with pytest.raises(CosimInputError, match="unknown link 'nvlink9'"):
            cat.link("nvlink9")
        with pytest.raises(CosimInputError, match="unknown cpu"):
            cat.cpu("i386")
        with pytest.raises(CosimInputError, match="unknown nic"):
            cat.nic("ne2000")

    def test_with_overrides_returns_new_catalog(self, cat: Catalog) -> None:
        before = cat.accelerator("h100-sxm5")
        new = cat.with_overrides({
            "links.nvlink4.bandwidth": "50 GB/s",
            "accelerators.h100-sxm5.peak_flops.bf16": "2 PFLOP/s",
            "accelerators.h100-sxm5.scale_up.links": 9,
        })
        assert new is not cat
        assert new.link("nvlink4").bandwidth == 50 * GB
        h = new.accelerator("h100-sxm5")
        assert h.peak_flops["bf16"] == 2 * PFLOPS and h.peak_flops["fp8"] == before.peak_flops["fp8"]
        assert h.scale_up is not None and h.scale_up.links == 9
        assert h.sources["peak_flops.bf16"].startswith("override")
        # derived entries see the change to their base
        assert new.accelerator("h800-sxm5").peak_flops["bf16"] == 2 * PFLOPS
        # the original (and the cached bundled catalog) are untouched
        assert cat.link("nvlink4").bandwidth == 25 * GB
        assert cat.accelerator("h100-sxm5") is before and before.peak_flops["bf16"] == pytest.approx(989.4 * TFLOPS)
        assert load_catalog().link("nvlink4").bandwidth == 25 * GB

    def test_override_null_and_bidirectional(self, cat: Catalog) -> None:
        new = cat.with_overrides({
            "accelerators.h800-sxm5.scale_up": None,
            "accelerators.h200-sxm.peak_flops.fp64": None,
            "links.nvlink5.bidirectional": "200 GB/s",
        })
        assert new.accelerator("h800-sxm5").scale_up is None
        assert "fp64" not in new.accelerator("h200-sxm").peak_flops
        assert new.link("nvlink5").bandwidth == 100 * GB
        # h800 extends h100: removing h100's scale_up leaves h800's `links: 8` without a link id
        with pytest.raises(CosimInputError, match=r"^accelerators\.h100-sxm5\.scale_up: missing required field "
                           r"'link' \(at accelerators\.h800-sxm5\.scale_up\.link\)"):
            cat.with_overrides({"accelerators.h100-sxm5.scale_up": None})

    @pytest.mark.parametrize(
        ("overrides", "expected"),
        [
            ({"links.nvlink4.bandwidth": 50},
             "links.nvlink4.bandwidth: bare number 50 needs a unit, e.g. '450 GB/s'"),
            ({"links.nvlink4.bandwidth": "50 GiB"},
             "links.nvlink4.bandwidth: 'GiB' is not a bandwidth unit; write it like '450 GB/s'"),
            ({"link.nvlink4.bandwidth": "1 GB/s"},
             "link.nvlink4.bandwidth: unknown catalog section 'link' (did you mean 'links'?); "
             "known: accelerators, cpus, links, nics"),
            ({"accelerators.h100-sxm5": "x"},
             "accelerators.h100-sxm5: override path must be section.id.field[.subkey], "
             "e.g. links.nvlink4.bandwidth"),
            ({"accelerators.h100-sxm5.tdp.max": "1 W"},
             "accelerators.h100-sxm5.tdp.max: tdp is '700 W', not a mapping with subkeys"),
        ],
    )
    def test_bad_overrides(self, cat: Catalog, overrides: dict, expected: str) -> None:
        with pytest.raises(CosimInputError) as exc:
            cat.with_overrides(overrides)
        assert str(exc.value) == expected

    def test_bad_override_field_and_id(self, cat: Catalog) -> None:
        with pytest.raises(CosimInputError, match=r"^accelerators\.h100-sxm5\.peak_flop\.bf16: unknown accelerator "
                           r"field 'peak_flop' \(did you mean 'peak_flops'"):
            cat.with_overrides({"accelerators.h100-sxm5.peak_flop.bf16": "1 PFLOP/s"})
        with pytest.raises(CosimInputError, match=r"^accelerators\.h1000\.tdp: unknown accelerator 'h1000'"):
            cat.with_overrides({"accelerators.h1000.tdp": "1 W"})
        with pytest.raises(CosimInputError, match=r"unknown datatype 'bf17' \(did you mean 'bf16'\?\)"):
            cat.with_overrides({"accelerators.h100-sxm5.peak_flops.bf17": "1 PFLOP/s"})
        with pytest.raises(CosimInputError, match="must be greater than zero"):
            cat.with_overrides({"links.ib-ndr.bandwidth": "0 Gb/s"})

    def test_override_error_located_in_yaml(self, cat: Catalog) -> None:
        doc = loads_yaml('overrides:\n  links.nvlink4.bandwidth: 50\n', "topo.yaml")
        with pytest.raises(CosimInputError) as exc:
            cat.with_overrides(doc["overrides"])
        assert str(exc.value) == ("topo.yaml:2:28: links.nvlink4.bandwidth: bare number 50 needs a unit, "
                                  "e.g. '450 GB/s'")

    def test_with_entries(self, cat: Catalog) -> None:
        new = cat.with_entries({"accelerators": {"my-chip": {"extends": "h100-sxm5", "hbm_bandwidth": "8 TB/s"}}})
        chip = new.accelerator("my-chip")
        assert isinstance(chip, Accelerator) and chip.hbm_bandwidth == 8e12
        assert chip.peak_flops == cat.accelerator("h100-sxm5").peak_flops
        assert "my-chip" not in cat.accelerators
        # the same definition again is accepted; a different one is not
        assert new.with_entries({"accelerators": {"my-chip": {"extends": "h100-sxm5", "hbm_bandwidth": "8 TB/s"}}})
        with pytest.raises(CosimInputError, match=r"accelerators\.my-chip: accelerator 'my-chip' is already defined"):
            new.with_entries({"accelerators": {"my-chip": {"extends": "h100-sxm5"}}})

    def test_with_entries_new_link(self, cat: Catalog) -> None:
        new = cat.with_entries({"links": {"optical-1t": {
            "name": "1.6T optical", "kind": "ethernet", "source": "what-if", "bandwidth": "1.6 Tb/s",
            "latency": "1 us", "efficiency": 0.9}}})
        link = new.link("optical-1t")
        assert isinstance(link, LinkType) and link.bandwidth == 200 * GB

    def test_redefining_bundled_id(self, tmp_path: Path) -> None:
        msg = load_error(tmp_path, """
            links:
              nvlink4:
                name: faster
        """)
        assert msg.startswith("parts.yaml:3:5: links.nvlink4: link 'nvlink4' is already defined (in ")
        assert "pick a new id and write `extends: nvlink4`" in msg


# --------------------------------------------------------------------------- bad user catalogs


class TestBadFiles:
    def test_unknown_key(self, tmp_path: Path) -> None:
        msg = load_error(tmp_path, """
            accelerators:
              my-chip:
                extends: h100-sxm5
                hbm_bandwith: "8 TB/s"
        """)
        assert msg.startswith("parts.yaml:4:19: accelerators.my-chip.hbm_bandwith: unknown key 'hbm_bandwith' "
                              "(did you mean 'hbm_bandwidth'?); valid: "), msg

    def test_bare_number(self, tmp_path: Path) -> None:
        msg = load_error(tmp_path, """
            links:
              my-link:
                name: My link
                kind: nvlink
                source: made up for a test
                bandwidth: 450
                latency: "1 us"
                efficiency: 0.8
        """)
        assert msg == "parts.yaml:6:16: links.my-link.bandwidth: bare number 450 needs a unit, e.g. '450 GB/s'"

    def test_missing_source(self, tmp_path: Path) -> None:
        msg = load_error(tmp_path, """
            nics:
              my-nic:
                name: My NIC
                vendor: me
                bandwidth: "400 Gb/s"
                latency: "1 us"
                message_rate: "300 Mmsg/s"
                per_message_overhead: "3 ns"
                gpudirect_rdma: true
                pcie: {generation: 5}
                link: ib-ndr
        """)
        assert msg == "parts.yaml:3:5: nics.my-nic.source: missing required field 'source'"

    def test_unknown_section(self, tmp_path: Path) -> None:
        msg = load_error(tmp_path, """
            accelerator:
              a: {}
        """)
        assert msg.startswith("parts.yaml:2:3: accelerator: unknown catalog section 'accelerator' "
                              "(did you mean 'accelerators'?)")

    def test_unknown_link_reference(self, tmp_path: Path) -> None:
        msg = load_error(tmp_path, """
            accelerators:
              a:
                extends: h100-sxm5
                scale_up: {link: nvlink7}
        """)
        assert msg.startswith("parts.yaml:4:22: accelerators.a.scale_up.link: unknown link 'nvlink7'")

    def test_bad_bidirectional(self, tmp_path: Path) -> None:
        msg = load_error(tmp_path, """
            accelerators:
              a:
                extends: h100-sxm5
                scale_up:
                  bidirectional: "100"
        """)
        assert msg == ("parts.yaml:5:7: accelerators.a.scale_up: bidirectional: bare number '100' needs a unit, "
                       "e.g. '450 GB/s'")

    def test_bad_id_and_shapes(self, tmp_path: Path) -> None:
        assert "id 'my.chip' must be letters" in load_error(tmp_path, """
            accelerators:
              my.chip: {extends: h100-sxm5}
        """)
        assert "expected a mapping of fields" in load_error(tmp_path, """
            accelerators:
              a: h100-sxm5
        """)
        assert load_error(tmp_path, "- 1\n").startswith("parts.yaml:1:1: a catalog file is a mapping")

    def test_sources_must_name_fields(self, tmp_path: Path) -> None:
        msg = load_error(tmp_path, """
            accelerators:
              a:
                extends: h100-sxm5
                source: test
                sources: {hbm_bw: "a paper"}
        """)
        # at the sources: line the check names (was the entry's first line, 3:5)
        assert msg.startswith("parts.yaml:5:14: accelerators.a: sources: 'hbm_bw' is not a field of this entry")

    def test_missing_file(self, tmp_path: Path) -> None:
        with pytest.raises(CosimInputError, match="file not found"):
            load_catalog(extra=[tmp_path / "nope.yaml"])

    def test_empty_file_adds_nothing(self, tmp_path: Path, cat: Catalog) -> None:
        c = load_catalog(extra=[write(tmp_path, "# nothing\n")])
        assert set(c.accelerators) == set(cat.accelerators)
