"""Bad input about the machine (an output location that cannot be written, a device this machine
does not have) is one line on stderr and exit code 2, found before any model loads, and leaves
nothing behind: no output folder, no probe file.

Tests run as root, which ignores permission bits, so unwritable places are ones that fail for
root too: a path under a regular file (ENOTDIR), a path under /proc, or a probe that is made to
fail with EROFS / EACCES / ENOSPC. CUDA and MPS are simulated by patching torch's answers, so
the same tests hold on a machine with a GPU.
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

import pytest
import torch

from evalkit.cli import main
from evalkit.errors import EvalkitError, PreflightError
from evalkit.sweep import preflight

from tests.cli_checks import one_line_exit_2

REPO = Path(__file__).resolve().parents[2]
STORE = REPO / "published" / "default"
SCHEME = "fp8_e4m3/tensor/dynamic"


@pytest.fixture(autouse=True)
def no_model_loads(monkeypatch):
    """Loading (or converting) a model fails the test: every check comes first."""
    import evalkit.models.loading

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the machine was checked")

    monkeypatch.setattr(evalkit.models.loading, "load_model", refuse)
    monkeypatch.setattr(evalkit.models.loading, "ensure_embedded", refuse)


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


# -- unwritable output locations, per command --------------------------------------------------


@pytest.fixture
def place(tmp_path):
    """An output location under a regular file: creating it fails with ENOTDIR, for root too."""
    (tmp_path / "afile").write_text("not a folder\n")
    (tmp_path / "cache").mkdir()
    return tmp_path


def _commands(out: str, cache: str) -> dict[str, tuple[list[str], str]]:
    """command -> (argv with ``out`` as the location under test, the flag the message names)."""
    return {
        "run --out": (["run", "--out", out, "--cache-dir", cache], "--out"),
        "run --cache-dir": (["run", "--cache-dir", out], "--cache-dir"),
        "sweep --out": (["sweep", "--quick", "--out", out, "--cache-dir", cache, "--no-progress"], "--out"),
        "sweep --cache-dir": (["sweep", "--quick", "--out", cache + "/store", "--cache-dir", out], "--cache-dir"),
        "report --plots": (["report", str(STORE), "--plots", out], "--plots"),
        "report --out": (["report", str(STORE), "--out", out + "/table.md"], "--out"),
        "calibrate --out": (["calibrate", "--out", out + "/scales.safetensors", "--samples", "1"], "--out"),
        "calibrate --export-vllm": (
            ["calibrate", "--scales", "calibration/smollm2-135m-head-amax.safetensors", "--export-vllm", out],
            "--export-vllm",
        ),
        "sensitivity --out": (["sensitivity", "--scheme", SCHEME, "--out", out, "--cache-dir", cache], "--out"),
        "sensitivity --cache-dir": (["sensitivity", "--scheme", SCHEME, "--cache-dir", out], "--cache-dir"),
        "merge OUT": (["merge", out, str(STORE)], "OUT"),
    }


CASES = list(_commands("o", "c"))


@pytest.mark.parametrize("case", CASES)
def test_location_under_a_file(case, place, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    out = str(place / "afile" / "out")
    argv, flag = _commands(out, str(place / "cache"))[case]
    before = tree(place)
    err = one_line_exit_2(
        argv, capsys, "cannot write to", str(place / "afile" / "out"), "is a file, not a folder", f"{flag} a "
    )
    assert "you can write" in err
    assert tree(place) == before  # nothing created, no probe file left


@pytest.mark.parametrize("case", CASES)
def test_read_only_file_system(case, place, capsys, monkeypatch):
    """A folder on a read-only file system (the probe fails with EROFS as it would there): the
    folder and its parents exist, nothing is created in them."""
    monkeypatch.chdir(REPO)
    ro = place / "ro"
    ro.mkdir()
    real = tempfile.mkstemp

    def mkstemp(*args, dir=None, **kwargs):
        if dir is not None and Path(dir).resolve().is_relative_to(ro.resolve()):
            raise OSError(errno.EROFS, "Read-only file system", str(dir))
        return real(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    out = str(ro / "new" / "out")
    argv, flag = _commands(out, str(place / "cache"))[case]
    before = tree(place)
    one_line_exit_2(argv, capsys, f"cannot write to {out}", "(read-only file system)", f"{flag} a ")
    assert tree(place) == before


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")
@pytest.mark.parametrize("case", ["run --out", "sweep --out", "report --plots", "calibrate --out", "sensitivity --out"])
def test_location_under_proc(case, tmp_path, capsys, monkeypatch):
    """/proc takes no new files, for root either."""
    monkeypatch.chdir(REPO)
    out = "/proc/evalkit-no-such-place/out"
    argv, flag = _commands(out, str(tmp_path / "cache"))[case]
    one_line_exit_2(argv, capsys, "cannot write to /proc/evalkit-no-such-place/out", f"{flag} a ")
    assert not tmp_path.joinpath("cache").exists()


def test_existing_file_as_out_folder(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    (tmp_path / "rows").write_text("x\n")
    one_line_exit_2(
        ["run", "--out", str(tmp_path / "rows"), "--cache-dir", str(tmp_path / "c")],
        capsys,
        "(it is a file, not a folder): pass --out a folder you can write",
    )
    assert tree(tmp_path) == ["rows"]


def test_chmod_folder_refused_when_not_root(tmp_path, capsys, monkeypatch):
    """A folder chmod 0o555: refused for an ordinary user; root may write it, so then it passes."""
    monkeypatch.chdir(REPO)
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        fd, probe = tempfile.mkstemp(dir=ro)
    except PermissionError:
        one_line_exit_2(["report", str(STORE), "--plots", str(ro / "plots")], capsys, "(permission denied)")
    else:
        os.close(fd)
        os.unlink(probe)
        preflight.check_writable(ro / "plots", "--plots")  # root: writable, and the check says so
    finally:
        ro.chmod(0o755)
    assert tree(tmp_path) == ["ro"]


# -- the check itself ----------------------------------------------------------------------------


def test_writable_places_pass_and_nothing_is_created(tmp_path):
    preflight.check_writable(None, "--out")
    preflight.check_writable(tmp_path / "a" / "b" / "c", "--out")
    preflight.check_writable(tmp_path, "--out")
    preflight.check_writable(tmp_path / "new.safetensors", "--out", kind="file")
    (tmp_path / "old.md").write_text("keep\n")
    preflight.check_writable(tmp_path / "old.md", "--out", kind="file")
    assert tree(tmp_path) == ["old.md"] and (tmp_path / "old.md").read_text() == "keep\n"


def test_relative_path_checks_the_working_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    preflight.check_writable("results/x", "--out")
    (tmp_path / "results").write_text("")
    with pytest.raises(PreflightError, match=r"^cannot write to results/x \(results is a file, not a folder\)"):
        preflight.check_writable("results/x", "--out")


def test_folder_given_where_a_file_is_wanted(tmp_path):
    with pytest.raises(PreflightError, match=r"\(it is a folder, not a file\): pass --out a file path you can write$"):
        preflight.check_writable(tmp_path, "--out", kind="file")


@pytest.mark.parametrize(
    "code, reason",
    [
        (errno.EROFS, "read-only file system"),
        (errno.EACCES, "permission denied"),
        (errno.EPERM, "permission denied"),
        (errno.ENOSPC, "no space left"),
        (errno.ENOTDIR, "is not a folder"),
    ],
)
def test_probe_errors_are_named(code, reason, tmp_path, monkeypatch):
    def mkstemp(*args, **kwargs):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    with pytest.raises(
        PreflightError, match=f"cannot write to {tmp_path}/out .*{reason}.*: pass --out a folder"
    ) as info:
        preflight.check_writable(tmp_path / "out", "--out")
    assert isinstance(info.value, EvalkitError) and "\n" not in str(info.value)
    assert tree(tmp_path) == []


# -- devices ---------------------------------------------------------------------------------------


@pytest.fixture
def no_cuda_build(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.version, "hip", None, raising=False)


@pytest.fixture
def one_gpu(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)


@pytest.fixture
def cuda_build_no_gpu(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture
def no_mps(monkeypatch):
    monkeypatch.setattr(torch.backends.mps, "is_built", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)


def _device_commands(device: str, tmp_path: Path, option: str = "--device") -> dict[str, list[str]]:
    cache = str(tmp_path / "cache")
    return {
        "run": ["run", option, device, "--cache-dir", cache, "--out", str(tmp_path / "out")],
        "calibrate": ["calibrate", option, device, "--out", str(tmp_path / "out" / "s.safetensors"), "--samples", "1"],
        "sensitivity": [
            "sensitivity",
            "--scheme",
            SCHEME,
            option,
            device,
            "--cache-dir",
            cache,
            "--out",
            str(tmp_path / "out"),
        ],
    }


DEVICE_CASES = [
    ("no_cuda_build", "cuda", ["this torch has no CUDA (torch ", "use --device cpu or install a CUDA build of torch"]),
    ("no_cuda_build", "cuda:1", ["--device cuda:1 but this torch has no CUDA", "use --device cpu"]),
    ("one_gpu", "cuda:3", ["--device cuda:3 but this machine has 1 CUDA GPU (cuda:0): use --device cuda:0"]),
    ("cuda_build_no_gpu", "cuda", ["--device cuda but no CUDA GPU is visible", "use --device cpu", "nvidia-smi"]),
    ("no_mps", "mps", ["--device mps but this torch has no MPS", "use --device cpu"]),
    (None, "gpu", ["--device gpu is not a device: use --device cpu, or cuda, cuda:N, mps"]),
]


@pytest.mark.parametrize("command", ["run", "calibrate", "sensitivity"])
@pytest.mark.parametrize("machine, device, needles", DEVICE_CASES, ids=[f"{m}-{d}" for m, d, _ in DEVICE_CASES])
def test_device_this_machine_lacks(command, machine, device, needles, tmp_path, capsys, monkeypatch, request):
    monkeypatch.chdir(REPO)
    if machine:
        request.getfixturevalue(machine)
    one_line_exit_2(_device_commands(device, tmp_path)[command], capsys, *needles)
    assert tree(tmp_path) == []


@pytest.mark.parametrize("command", ["run", "sensitivity"])
def test_device_map_naming_a_missing_gpu(command, tmp_path, capsys, monkeypatch, one_gpu):
    monkeypatch.chdir(REPO)
    one_line_exit_2(
        _device_commands("cuda:2", tmp_path, "--device-map")[command],
        capsys,
        "--device-map cuda:2 but this machine has 1 CUDA GPU",
        "use --device-map cuda:0",
    )
    assert tree(tmp_path) == []


def test_devices_this_machine_has_pass(one_gpu, no_mps):
    for device in (None, "cpu", "cuda", "cuda:0"):
        preflight.check_device(device)
    for device_map in (None, "auto", "balanced", "sequential", "cuda:0"):
        preflight.check_device_map(device_map)
    with pytest.raises(PreflightError, match="^--device meta holds no data"):
        preflight.check_device("meta")


def test_several_gpus_named_in_the_message(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    preflight.check_device("cuda:3")
    with pytest.raises(
        PreflightError,
        match=r"cuda:4 but this machine has 4 CUDA GPUs \(cuda:0 \.\.\. cuda:3\): "
        r"use --device cuda:N with N < 4",
    ):
        preflight.check_device("cuda:4")


def grid_file(tmp_path: Path, device_line: str) -> Path:
    path = tmp_path / "g.yaml"
    path.write_text(
        "name: devgrid\nmodels:\n  - {name: embedded, " + device_line + "}\nschemes: [auto]\n"
        "evals:\n  perplexity: {window: 64, stride: 64, max_windows: 1}\n"
    )
    return path


@pytest.mark.parametrize(
    "machine, line, needles",
    [
        (
            "no_cuda_build",
            "device: cuda",
            ["model embedded: device: cuda but this torch has no CUDA", "use device: cpu in the grid"],
        ),
        ("one_gpu", "device: 'cuda:3'", ["device: cuda:3 but this machine has 1 CUDA GPU", "use device: cuda:0"]),
        ("no_mps", "device: mps", ["device: mps but this torch has no MPS", "use device: cpu in the grid"]),
        ("no_cuda_build", "gpus: 1", ["device: cuda but this torch has no CUDA"]),
        ("one_gpu", "device_map: 'cuda:1'", ["device_map: cuda:1 but this machine has 1 CUDA GPU"]),
    ],
)
def test_sweep_grid_device_checked_before_the_first_run(machine, line, needles, tmp_path, capsys, monkeypatch, request):
    request.getfixturevalue(machine)
    grid = grid_file(tmp_path, line)
    out = tmp_path / "store"
    one_line_exit_2(
        ["sweep", str(grid), "--out", str(out), "--cache-dir", str(tmp_path / "cache"), "--no-progress"],
        capsys,
        f"grid {grid}",
        *needles,
    )
    assert tree(tmp_path) == ["g.yaml"]  # no store, no cache


def test_sweep_dry_run_plans_for_other_machines(tmp_path, capsys, no_cuda_build):
    """A dry run writes nothing and runs nothing: a CUDA grid is sized on a CPU machine."""
    grid = grid_file(tmp_path, "device: cuda")
    assert (
        main(
            [
                "sweep",
                str(grid),
                "--dry-run",
                "--assume-device",
                "h200",
                "--out",
                str(tmp_path / "store"),
                "--cache-dir",
                str(tmp_path / "cache"),
            ]
        )
        == 0
    )
    assert tree(tmp_path) == ["g.yaml"]


def test_sweep_on_ray_leaves_devices_to_the_workers(tmp_path, capsys, monkeypatch, no_cuda_build):
    """With --executor ray the runs go to the cluster's workers: this machine's lack of CUDA is not
    checked (the executor is reached; it is stopped there)."""
    import evalkit.sweep.executors

    def stop(*args, **kwargs):
        raise EvalkitError("executor reached")

    monkeypatch.setattr(evalkit.sweep.executors, "make_executor", stop)
    grid = grid_file(tmp_path, "device: cuda")
    one_line_exit_2(
        [
            "sweep",
            str(grid),
            "--executor",
            "ray",
            "--out",
            str(tmp_path / "store"),
            "--cache-dir",
            str(tmp_path / "cache"),
            "--no-progress",
        ],
        capsys,
        "executor reached",
    )


# -- the run's own problems, before the model loads (evalkit.sweep.preflight.commands) -------------------


def test_run_with_a_missing_scale_file_fails_in_one_line_before_loading(tmp_path, capsys):
    """The issue's case: the model used to load (minutes on a 70B) before the missing file was noticed."""
    one_line_exit_2(
        ["run", "--schemes", "fp8_e4m3/tensor/static+scales=/nope.safetensors", "--cache-dir", str(tmp_path)],
        capsys,
        "static scale file /nope.safetensors does not exist",
        "python -m evalkit calibrate",
    )
    assert tree(tmp_path) == []


def test_run_lists_every_problem_of_its_schemes(tmp_path, capsys):
    """As a sweep does: every problem of the one-model grid at once (the profile's refusals, a scale file the
    profile cannot read), then, on a grid without them, every problem of its runs (scale files, architecture)."""
    argv = ["run", "--cache-dir", str(tmp_path), "--engine-profile", "vllm-cuda", "--schemes"]
    schemes = (
        "fp8_e4m3/tensor/unit,fp8_e4m3/head/dynamic,vllm:fp8_ds_mla,fp8_e4m3/tensor/static+scales=/nope.safetensors"
    )
    assert main([*argv, schemes]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 3 and all(x.startswith("evalkit: error: ") for x in lines), lines
    assert "vllm-cuda cannot run fp8_e4m3/head/dynamic" in lines[0]  # the profile's, in the order given
    assert "vllm-cuda cannot run vllm:fp8_ds_mla" in lines[1]
    assert "/nope.safetensors does not exist" in lines[2]
    assert tree(tmp_path) == []

    schemes = "fp8_e4m3/tensor/unit,vllm:fp8_ds_mla,fp8_e4m3/tensor/static+scales=/nope.safetensors"
    assert main([*argv[:3], "--schemes", schemes]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and all(x.startswith("evalkit: error: ") for x in lines), lines
    assert "/nope.safetensors does not exist" in lines[0]  # the scale files, then the architecture
    assert "vllm:fp8_ds_mla on embedded (llama: 3 KV heads of head_dim 64)" in lines[1]
    assert tree(tmp_path) == []
