"""The score cache kept on disk (``--cache-dir``, engines/llama/persist.c).

After a restart an exact repeat computes nothing and answers with a cold
engine's bits (``--float-digits 17``: ``==`` on the parsed floats compares
bits). A file that does not match the engine (another model, build, numerics,
template, format version) or does not check (torn, corrupted) is skipped with
one stderr line naming the reason, and the engine computes the answer afresh;
an unwritable directory only costs the persistence. kill -9 in the middle of a
write leaves a readable cache; two engines share one directory.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import signal
import struct
import sys
from pathlib import Path

import anyio
import pytest

from bench.digits import GROUPS, STATE, numbers, spawn
from gateway.engine import EngineError

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

#: Offsets of file_header's fields (persist.c): the ones the tests rewrite.
VERSION, MODEL, BUILD, NUMERICS, TMPL, HEADER_SUM = (8, 4), (16, 64), (80, 32), (112, 32), (144, 64), (248, 8)
OTHER_GROUPS = [("Is this about billing?", [" yes", " no"])]


@pytest.fixture(scope="module")
def anyio_backend():
    return "asyncio"


@pytest.fixture(scope="module")
async def cold(model_path):
    """The numbers of an engine that never saw a cache."""
    async with spawn(model_path) as eng:
        return numbers(await eng.score(STATE, GROUPS))


def files(root: Path, pattern: str = "scores/*/*.spc") -> list[Path]:
    return sorted(root.glob(pattern))


def reseal(path: Path, **fields: bytes) -> None:
    """Rewrites header fields (name -> bytes, NUL padded) and the header's checksum, as a file
    written by that other engine would have them."""
    data = bytearray(path.read_bytes())
    for name, value in fields.items():
        off, size = {"version": VERSION, "model": MODEL, "build": BUILD, "numerics": NUMERICS, "tmpl": TMPL}[name]
        data[off : off + size] = value.ljust(size, b"\0")
    digest = hashlib.sha256(bytes(data[:248])).digest()
    data[248:256] = digest[:8]
    path.write_bytes(bytes(data))


def cache_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "cache:" in r.getMessage()]


async def fill(model_path, root: Path) -> list[list[float]]:
    async with spawn(model_path, "--cache-dir", str(root)) as eng:
        first = await eng.score(STATE, GROUPS)
        assert first.computed > 0
    assert len(files(root)) == 1
    return numbers(first)


async def test_a_restart_answers_an_exact_repeat_from_disk_with_a_cold_engines_bits(model_path, cold, tmp_path):
    root = tmp_path / "cache"
    assert await fill(model_path, root) == cold
    manifest = (root / "manifest.json").read_text()
    assert manifest == '{"format": "serveproto-cache", "version": 1}\n'
    async with spawn(model_path, "--cache-dir", str(root)) as eng:
        assert eng.caps.values["x_persist"] == "1"
        again = await eng.score(STATE, GROUPS)
        assert again.computed == 0 and again.reused > 0
        assert again.disk == again.reused  # DONE disk=: every reused position came from the file
        assert numbers(again) == cold
        # a question not on disk is computed, the known ones still come from disk
        grown = await eng.score(STATE, GROUPS + OTHER_GROUPS)
        assert 0 < grown.computed < again.reused and grown.disk == grown.reused > 0
        assert numbers(grown)[: len(GROUPS)] == cold
    # nothing new read from disk is written again; the new question is
    assert len(files(root)) == 2
    async with spawn(model_path, "--cache-dir", str(root), "--model-sha256", "0" * 64) as eng:
        # another model identity: its own folder, nothing of this one's read
        other = await eng.score(STATE, GROUPS)
        assert other.computed > 0 and numbers(other) == cold
    assert len(files(root, "scores/0000000000000000/*.spc")) == 1


@pytest.mark.parametrize(
    "case, why",
    [
        ("build", "another engine build (0123456789abcdef, this engine "),
        ("numerics", "other numerics (invariant kv=f16, this engine invariant kv=f32)"),
        ("template", "another chat template (sha256 000000000000..., this model's "),
        ("version", "format version 2, this engine reads version 1"),
        ("model", "another model (sha256 b179c9523d0e..., this model 111111111111...)"),
        ("truncated", "bytes, its header says"),
        ("corrupted", "payload checksum mismatch (torn or corrupted)"),
        ("header", "header checksum mismatch (torn or corrupted)"),
    ],
)
async def test_a_file_that_does_not_match_or_check_is_skipped_with_its_reason(
    model_path, cold, tmp_path, caplog, case, why
):
    caplog.set_level(logging.INFO)
    root = tmp_path / "cache"
    await fill(model_path, root)
    (path,) = files(root)
    extra: list[str] = []
    if case == "build":
        reseal(path, build=b"0123456789abcdef")
    elif case == "numerics":
        reseal(path, numerics=b"invariant kv=f16")
    elif case == "template":
        reseal(path, tmpl=b"0" * 64)
    elif case == "version":
        reseal(path, version=struct.pack("<I", 2))
    elif case == "model":
        # a file of this model copied into another model's folder
        other = root / "scores" / "1111111111111111"
        other.mkdir()
        path = Path(shutil.copy(path, other / path.name))
        extra = ["--model-sha256", "1" * 64]
    elif case == "truncated":
        path.write_bytes(path.read_bytes()[:-5])
    elif case == "corrupted":
        data = bytearray(path.read_bytes())
        data[-3] ^= 0x40
        path.write_bytes(bytes(data))
    elif case == "header":
        data = bytearray(path.read_bytes())
        data[100] ^= 1
        path.write_bytes(bytes(data))
    caplog.clear()
    async with spawn(model_path, "--cache-dir", str(root), *extra) as eng:
        again = await eng.score(STATE, GROUPS)
    assert again.computed > 0 and numbers(again) == cold
    skipped = [line for line in cache_lines(caplog) if " skipped: " in line]
    assert len(skipped) == 1, cache_lines(caplog)
    assert f"{path} skipped: " in skipped[0] and why in skipped[0]


async def test_other_numerics_and_another_manifest_version_are_not_read(model_path, cold, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    root = tmp_path / "cache"
    await fill(model_path, root)
    # an F16 KV cache gives other digits: the F32 file is refused, named by the numerics
    async with spawn(model_path, "--cache-dir", str(root), "--kv-type", "f16") as eng:
        f16 = await eng.score(STATE, GROUPS)
    assert f16.computed > 0 and numbers(f16) != cold
    assert any("other numerics (invariant kv=f32, this engine invariant kv=f16)" in m for m in cache_lines(caplog))
    # --numerics fast keeps nothing on disk and reads nothing from it
    caplog.clear()
    async with spawn(model_path, "--cache-dir", str(root), "--numerics", "fast") as eng:
        fast = await eng.score(STATE, GROUPS)
    assert fast.computed > 0
    assert any(f"--numerics fast: nothing read from or kept in {root}" in m for m in cache_lines(caplog))
    (root / "manifest.json").write_text('{"format": "serveproto-cache", "version": 2}\n')
    caplog.clear()
    n_files = len(files(root))
    async with spawn(model_path, "--cache-dir", str(root)) as eng:
        again = await eng.score(STATE, GROUPS)
    assert again.computed > 0 and numbers(again) == cold
    assert any("format version 2, this engine reads version 1: the cache is not used" in m for m in cache_lines(caplog))
    assert len(files(root)) == n_files  # nothing written either


async def test_an_unwritable_directory_serves_on_and_says_so(model_path, cold, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    async with spawn(model_path, "--cache-dir", str(blocker / "cache")) as eng:
        first = await eng.score(STATE, GROUPS)
        again = await eng.score(STATE, GROUPS)
    assert numbers(first) == cold and again.computed == 0  # the memory cache still serves
    lines = cache_lines(caplog)
    assert any(
        f"{blocker}/cache cannot be made (Not a directory): serving on, nothing will be written" in m for m in lines
    )
    # read-only on purpose: reads what is there, writes nothing
    root = tmp_path / "cache"
    await fill(model_path, root)
    before = {p: p.stat().st_mtime_ns for p in files(root)}
    async with spawn(model_path, "--cache-dir", str(root), "--cache-read-only") as eng:
        again = await eng.score(STATE, GROUPS)
        grown = await eng.score(STATE, GROUPS + OTHER_GROUPS)
    assert again.computed == 0 and numbers(again) == cold and grown.computed > 0
    assert {p: p.stat().st_mtime_ns for p in files(root)} == before


async def test_kill_9_during_a_write_leaves_a_readable_cache(model_path, cold, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    root = tmp_path / "cache"
    await fill(model_path, root)
    old = files(root)
    # the engine pauses 3 s in the middle of its next file: killed there
    os.environ["SERVEPROTO_CACHE_WRITE_DELAY_MS"] = "3000"
    try:
        async with spawn(model_path, "--cache-dir", str(root)) as eng:
            await eng.score(STATE, OTHER_GROUPS)
            for _ in range(100):
                if list((root / "scores").glob("*/.tmp-*")):
                    break
                await anyio.sleep(0.05)
            os.kill(eng.pid, signal.SIGKILL)
            await anyio.sleep(0.2)
    except EngineError:
        pass
    finally:
        del os.environ["SERVEPROTO_CACHE_WRITE_DELAY_MS"]
    assert len(list((root / "scores").glob("*/.tmp-*"))) == 1  # the torn write, under its temporary name
    assert files(root) == old
    caplog.clear()
    async with spawn(model_path, "--cache-dir", str(root)) as eng:
        again = await eng.score(STATE, GROUPS)
        other = await eng.score(STATE, OTHER_GROUPS)
    assert again.computed == 0 and numbers(again) == cold
    assert other.computed > 0  # what the killed engine was writing is computed again
    assert not [m for m in cache_lines(caplog) if " skipped: " in m]


async def test_two_engines_share_one_directory(model_path, cold, tmp_path):
    root = tmp_path / "cache"
    questions = [[g] for g in GROUPS] + [OTHER_GROUPS]
    results: dict[int, list] = {}

    async def one(k: int) -> None:
        async with spawn(model_path, "--cache-dir", str(root)) as eng:
            # both read the same questions, in opposite orders, and each one of its own
            order = questions if k == 0 else questions[::-1]
            results[k] = [numbers(await eng.score(STATE, q))[0] for q in order]

    async with anyio.create_task_group() as tg:
        tg.start_soon(one, 0)
        tg.start_soon(one, 1)
    assert results[0] == results[1][::-1]
    assert results[0][: len(GROUPS)] == cold
    async with spawn(model_path, "--cache-dir", str(root)) as eng:
        for q, want in zip(questions, results[0]):
            again = await eng.score(STATE, q)
            assert again.computed == 0 and numbers(again)[0] == want


async def test_the_disk_budget_keeps_the_most_recently_used_files(model_path, tmp_path):
    root = tmp_path / "cache"
    async with spawn(model_path, "--cache-dir", str(root), "--cache-disk-mb", "0") as eng:
        await eng.score(STATE, GROUPS)
    assert files(root) == []  # a budget of 0 keeps nothing
    await fill(model_path, root)
    assert len(files(root)) == 1


# ---- through serveproto serve -----------------------------------------------------------------

TICKET = {
    "state": "The invoice was paid twice and the customer wants the money back before Friday.",
    "questions": {
        "refund": {"type": "noul", "instructions": "Does the customer ask for a refund?"},
        "team": {
            "type": "choice",
            "instructions": "Who handles it?",
            "criteria": {"billing": "invoices and payments", "customer success": None, "legal": "contracts"},
        },
    },
}


async def ask(url: str, root: Path) -> tuple[dict, str]:
    """One /v1/systemone of TICKET and the /metrics text after it; waits until the engine wrote
    what it computed (it writes when idle), so that stopping the server cannot cut it."""
    import httpx2
    import orjson

    before = len(files(root))
    async with httpx2.AsyncClient(base_url=url, timeout=120) as c:
        r = await c.post("/v1/systemone", content=orjson.dumps(TICKET), headers={"content-type": "application/json"})
        assert r.status_code == 200, r.text
        body = r.json()
        if body["x_positions"]["computed"] > 0:
            # each SCORE of the request is written once the engine is idle after it: wait for the
            # files to stop coming
            seen, still = before, 0
            for _ in range(400):
                await anyio.sleep(0.05)
                now = len(files(root))
                seen, still = now, (still + 1 if now == seen and now > before else 0)
                if still >= 20:
                    break
        metrics = (await c.get("/metrics")).text
    return body, metrics


async def test_a_restarted_server_answers_a_repeat_and_its_content_free_readings_from_disk(model_path, tmp_path):
    from test_routes_support import serving

    root = tmp_path / "cache"
    async with serving("--threads", "2", "--cache-dir", str(root)) as url:
        first, _ = await ask(url, root)
    async with serving("--threads", "2", "--cache-dir", str(root)) as url:
        again, metrics = await ask(url, root)
    # the default model's corrections read content-free prompts: after the restart the gateway
    # has forgotten them and asks again, and the engine answers them from disk too
    pos = first["x_positions"]
    assert pos["computed"] > 0 and pos["disk"] == 0
    assert again["x_positions"] == {
        "computed": 0,
        "reused": pos["computed"] + pos["reused"],
        "snapshot": "hit",  # the prompt's fixed head, pinned by the gateway, restored from its file
        "disk": pos["computed"] + pos["reused"],
    }
    strip = ("x_request_id", "x_engine_ms", "x_positions", "id", "created")
    assert {k: v for k, v in again.items() if k not in strip} == {k: v for k, v in first.items() if k not in strip}
    assert f"serveproto_prompt_positions_from_disk_total {float(again['x_positions']['disk'])}" in metrics


# ---- snapshots on disk ------------------------------------------------------------------------

#: A state of about 2K tokens of the default model (a support log, each line different).
LINES = [
    f"Entry {i}: the customer wrote again about invoice {1000 + 7 * i}, which was charged {i % 3 + 2} times."
    for i in range(80)
]
LONG_STATE = "<|im_start|>user\n" + " ".join(LINES)
SHORT_STATE = "<|im_start|>user\n" + " ".join(LINES[:12])  # about 300 tokens: the refusal cases
NEW_QUESTION = [("\nQ: Is the customer angry? A:", [" yes", " no"])]


async def known_state(model_path, root: Path, state: str) -> None:
    """Scores GROUPS on ``state`` with a snapshot (pin), in an engine that then exits. It writes the
    state file when idle and at exit (a 2K-token state is 94 MB, fsynced): on a loaded machine that
    takes longer than the 5 s an engine gets to exit after EOF, so this one gets a minute."""
    async with spawn(model_path, "--cache-dir", str(root), "--threads", "2", drain_timeout=60.0) as eng:
        await eng.score(state, GROUPS, pin=True)
    assert len(files(root, "states/*/*.sps")) == 1


async def test_a_restart_answers_a_known_states_new_question_computing_only_its_tokens(model_path, tmp_path):
    root = tmp_path / "cache"
    await known_state(model_path, root, LONG_STATE)
    async with spawn(model_path, "--threads", "2") as eng:
        cold = await eng.score(LONG_STATE, NEW_QUESTION)
    assert cold.computed > 1900  # the state is about 2K tokens
    async with spawn(model_path, "--cache-dir", str(root), "--threads", "2") as eng:
        warm = await eng.score(LONG_STATE, NEW_QUESTION, pin=True)
    assert numbers(warm) == numbers(cold)
    assert warm.done.snapshot == "hit"
    # only the question's own positions: the stem past the state and the option's tokens
    assert 0 < warm.computed <= 16 and warm.computed + warm.disk == cold.computed
    assert warm.reused == warm.disk


@pytest.mark.parametrize("case", ["build", "corrupted", "tokens"])
async def test_a_state_file_that_does_not_match_or_check_is_skipped_and_the_state_recomputed(
    model_path, tmp_path, caplog, case
):
    caplog.set_level(logging.INFO)
    root = tmp_path / "cache"
    await known_state(model_path, root, SHORT_STATE)
    (path,) = files(root, "states/*/*.sps")
    if case == "build":
        reseal(path, build=b"0123456789abcdef")
        why = "another engine build (0123456789abcdef, this engine "
    elif case == "corrupted":
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x10  # one bit of a KV row
        path.write_bytes(bytes(data))
        why = "payload checksum mismatch (torn or corrupted)"
    else:  # a file whose name promises other tokens than it holds: renamed onto another state's name
        other = path.with_name(path.name.replace(path.name[:4], "0000", 1))
        path.rename(other)
        path = other
        why = None
    async with spawn(model_path, "--threads", "2") as eng:
        cold = await eng.score(SHORT_STATE, NEW_QUESTION)
    caplog.clear()
    async with spawn(model_path, "--cache-dir", str(root), "--threads", "2") as eng:
        again = await eng.score(SHORT_STATE, NEW_QUESTION)
    assert numbers(again) == numbers(cold) and again.computed == cold.computed and again.disk == 0
    skipped = [m for m in cache_lines(caplog) if " skipped: " in m]
    if why is None:
        assert skipped == []  # its name hashes no prefix of the prompt: never opened
    else:
        assert len(skipped) == 1 and f"{path} skipped: {why}" in skipped[0], skipped


# ---- what checks is still read as data (issue 46) ---------------------------------------------
# A file's checksums say it is whole, not that its numbers are sane nor that it is what its size
# says: every number is checked finite and every size bounded before the engine allocates or serves,
# a damaged file is removed (read-only: remembered), and nothing on disk hangs or kills the engine.

#: file_header's payload fields (persist.c): payload_bytes, payload_sum, n_records.
PAYLOAD_BYTES, PAYLOAD_SUM = 208, 216


@pytest.fixture(scope="module")
def xxh3():
    """XXH3-64 of bytes, from llama.cpp's vendored xxhash.h (the engine's own), built once with cc."""
    import ctypes
    import subprocess

    from gateway.paths import cache_dir

    heads = sorted(cache_dir().glob("llama.cpp/*/src*/vendor/hash/xxhash/xxhash.h"))
    if not heads:
        pytest.skip("llama.cpp's vendored xxhash.h is not in the cache")
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"sp-xxh3-{os.getpid()}.so"
    src = '#define XXH_INLINE_ALL\n#include "xxhash.h"\nunsigned long long sp_xxh3(const void *p, size_t n) { return XXH3_64bits(p, n); }\n'
    subprocess.run(
        ["cc", "-shared", "-fPIC", "-O1", f"-I{heads[-1].parent}", "-x", "c", "-", "-o", str(out)],
        input=src.encode(),
        check=True,
    )
    lib = ctypes.CDLL(str(out))
    out.unlink()
    lib.sp_xxh3.restype = ctypes.c_ulonglong
    lib.sp_xxh3.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    return lambda b: lib.sp_xxh3(bytes(b), len(b))


def reseal_payload(path: Path, data: bytearray, xxh3) -> None:
    """Writes ``data`` (a whole cache file) with its payload's and header's checksums made valid again:
    what anyone who can write the folder can do."""
    payload = bytes(data[256:])
    data[PAYLOAD_BYTES : PAYLOAD_BYTES + 8] = struct.pack("<Q", len(payload))
    data[PAYLOAD_SUM : PAYLOAD_SUM + 8] = struct.pack("<Q", xxh3(payload))
    data[248:256] = hashlib.sha256(bytes(data[:248])).digest()[:8]
    path.write_bytes(bytes(data))


def skipped_lines(caplog) -> list[str]:
    return [m.split("cache: ", 1)[1] for m in cache_lines(caplog) if " skipped: " in m]


@pytest.mark.parametrize("value", [float("nan"), float("-inf")])
async def test_a_sealed_scores_file_with_a_non_finite_logprob_is_never_served(
    model_path, cold, tmp_path, caplog, xxh3, value
):
    caplog.set_level(logging.INFO)
    root = tmp_path / "cache"
    await fill(model_path, root)
    (path,) = files(root)
    data = bytearray(path.read_bytes())
    data[256 + 32 : 256 + 40] = struct.pack("<d", value)  # the first record's first logprob
    reseal_payload(path, data, xxh3)
    mtime = path.stat().st_mtime_ns
    # a read-only replica: skips it with one line, leaves it where it is, untouched
    caplog.clear()
    async with spawn(model_path, "--cache-dir", str(root), "--cache-read-only") as eng:
        again = await eng.score(STATE, GROUPS)
        twice = await eng.score(STATE, GROUPS)
    assert numbers(again) == cold and numbers(twice) == cold and again.disk == 0
    assert skipped_lines(caplog) == [f"{path} skipped: record 0 holds a logprob that is not finite"]
    assert path.stat().st_mtime_ns == mtime
    # a writer removes it: the next restart does not read it again
    caplog.clear()
    async with spawn(model_path, "--cache-dir", str(root)) as eng:
        again = await eng.score(STATE, GROUPS)
    assert numbers(again) == cold and again.computed > 0
    assert skipped_lines(caplog) == [f"{path} skipped: record 0 holds a logprob that is not finite; removed"]
    assert not path.exists()
    caplog.clear()
    async with spawn(model_path, "--cache-dir", str(root)) as eng:
        again = await eng.score(STATE, GROUPS)
    assert numbers(again) == cold and again.computed == 0 and skipped_lines(caplog) == []


async def test_a_sealed_header_cannot_make_the_engine_allocate_past_what_its_kind_holds(
    model_path, cold, tmp_path, caplog
):
    caplog.set_level(logging.INFO)
    root = tmp_path / "cache"
    await fill(model_path, root)
    (path,) = files(root)
    data = bytearray(path.read_bytes()[:256])
    data[PAYLOAD_BYTES : PAYLOAD_BYTES + 8] = struct.pack("<Q", 3 << 30)
    data[248:256] = hashlib.sha256(bytes(data[:248])).digest()[:8]
    path.write_bytes(bytes(data))
    os.truncate(path, 256 + (3 << 30))  # sparse: the size matches the header's
    async with spawn(model_path, "--cache-dir", str(root)) as eng:
        again = await eng.score(STATE, GROUPS)
    assert numbers(again) == cold and again.computed > 0
    assert skipped_lines(caplog) == [
        f"{path} skipped: its header says 3221225472 payload bytes, more than such a file holds (at most 4194304);"
        " removed"
    ]
    assert not path.exists()


async def test_cache_files_are_private_to_the_user(model_path, tmp_path):
    root = tmp_path / "a" / "cache"
    await fill(model_path, root)
    modes = {
        str(p.relative_to(tmp_path)): oct(p.stat().st_mode & 0o777)
        for p in [tmp_path / "a", root, *sorted(root.rglob("*"))]
    }
    (scores,) = files(root)
    model16 = scores.parent.name
    assert modes == {
        "a": "0o700",
        "a/cache": "0o700",
        "a/cache/lock": "0o600",
        "a/cache/manifest.json": "0o600",
        "a/cache/scores": "0o700",
        f"a/cache/scores/{model16}": "0o700",
        f"a/cache/scores/{model16}/{scores.name}": "0o600",
        "a/cache/states": "0o700",
        f"a/cache/states/{model16}": "0o700",
    }


def fsize_limited(nbytes: int) -> list[str]:
    """An argv prefix that runs the engine under ``ulimit -f`` (``RLIMIT_FSIZE``, as systemd's
    ``LimitFSIZE=`` does): what a preexec_fn would do, done before exec."""
    return [
        sys.executable,
        "-c",
        "import os, resource, sys; resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]),) * 2);"
        " os.execv(sys.argv[2], sys.argv[2:])",
        str(nbytes),
    ]


async def test_a_file_size_limit_fails_the_big_write_and_not_the_engine_nor_the_small_writes(
    model_path, tmp_path, caplog
):
    from gateway.paths import engine_bin

    caplog.set_level(logging.INFO)
    root = tmp_path / "cache"
    async with spawn(model_path, "--threads", "2") as eng:
        cold_state = numbers(await eng.score(SHORT_STATE, GROUPS))
    argv = [*fsize_limited(1 << 20), str(engine_bin("serveproto-llama")), "--model", str(model_path)]
    argv += ["--threads", "2", "--float-digits", "17", "--cache-dir", str(root)]
    from gateway.engine import Engine

    async with Engine.spawn(argv) as eng:
        first = await eng.score(SHORT_STATE, GROUPS, pin=True)  # its state file: about 14 MB
        for _ in range(200):  # written when idle: the state file fails, the scores file fits
            if files(root):
                break
            await anyio.sleep(0.05)
        second = await eng.score(SHORT_STATE, OTHER_GROUPS)
    assert numbers(first) == cold_state and second.computed > 0
    lines = cache_lines(caplog)
    states_dir = next((root / "states").iterdir())
    assert f"{states_dir}: a write failed (File too large): serving on; later writes are tried again" in "\n".join(
        lines
    ), lines
    assert any("writing again (1 writes failed before this one)" in m for m in lines), lines
    assert files(root, "states/*/*.sps") == [] and len(files(root)) == 2  # both requests' scores
    assert list(root.rglob(".tmp-*")) == []  # the cut write's temporary file removed


@pytest.fixture(scope="module")
async def short_state(model_path, tmp_path_factory):
    """A folder holding SHORT_STATE's state file (about 14 MB), copied by the tests below."""
    root = tmp_path_factory.mktemp("short-state") / "cache"
    await known_state(model_path, root, SHORT_STATE)
    return root


@pytest.fixture(scope="module")
async def short_cold(model_path):
    async with spawn(model_path, "--threads", "2") as eng:
        return numbers(await eng.score(SHORT_STATE, NEW_QUESTION))


def copied(src: Path, tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "cache"
    shutil.copytree(src, root)
    (path,) = files(root, "states/*/*.sps")
    return root, path


def first_k_value(data: bytearray) -> int:
    """The offset in a state file of its first K value (layer 0, cell 0): past the header, the state's
    head (n, n_vocab, state_bytes), tokens and logits, and llama.cpp's magic, sequence, stream count,
    cell count, cells (position, sequence count, sequence), v_trans, layer count, K type and row size."""
    n, n_vocab = struct.unpack_from("<ii", data, 256)
    at = 256 + 16 + 4 * n + 4 * n_vocab
    _magic, _seq, n_stream, cells = struct.unpack_from("<IiII", data, at)
    assert n_stream == 1 and cells == n
    at += 16 + 12 * cells
    _v_trans, _n_layer, k_type = struct.unpack_from("<IIi", data, at)
    assert k_type == 0  # F32
    return at + 12 + 8


@pytest.mark.parametrize("case", ["nan_k", "corrupted"])
async def test_a_damaged_state_file_is_skipped_removed_and_written_anew(
    model_path, short_state, short_cold, tmp_path, caplog, xxh3, case
):
    caplog.set_level(logging.INFO)
    root, path = copied(short_state, tmp_path)
    data = bytearray(path.read_bytes())
    if case == "nan_k":
        at = first_k_value(data)
        data[at : at + 4] = struct.pack("<f", float("nan"))
        reseal_payload(path, data, xxh3)
        why = "a KV row holds a value that is not finite"
    else:
        data[len(data) // 2] ^= 0x10
        path.write_bytes(bytes(data))
        why = "payload checksum mismatch (torn or corrupted)"
    mtime = path.stat().st_mtime_ns
    # a read-only replica skips it once, however many requests ask for the state, and leaves it be
    caplog.clear()
    async with spawn(model_path, "--cache-dir", str(root), "--threads", "2", "--cache-read-only") as eng:
        for _ in range(2):
            again = await eng.score(SHORT_STATE, NEW_QUESTION)
            assert numbers(again) == short_cold and again.disk == 0
    assert skipped_lines(caplog) == [f"{path} skipped: {why}"]
    assert path.stat().st_mtime_ns == mtime
    # a writer removes it and, the state pinned again, writes it anew; the next restart restores that
    caplog.clear()
    async with spawn(model_path, "--cache-dir", str(root), "--threads", "2", drain_timeout=60.0) as eng:
        again = await eng.score(SHORT_STATE, NEW_QUESTION, pin=True)
    assert numbers(again) == short_cold and again.disk == 0
    assert skipped_lines(caplog) == [f"{path} skipped: {why}; removed"]
    assert path.exists() and path.read_bytes() != bytes(data)
    caplog.clear()
    async with spawn(model_path, "--cache-dir", str(root), "--threads", "2", "--cache-read-only") as eng:
        warm = await eng.score(SHORT_STATE, NEW_QUESTION)
    assert numbers(warm) == short_cold and warm.disk > 0 and skipped_lines(caplog) == []


async def test_a_read_only_replica_restores_a_state_without_touching_its_file(
    model_path, short_state, short_cold, tmp_path
):
    root, _ = copied(short_state, tmp_path)
    before = {p: p.stat().st_mtime_ns for p in root.rglob("*")}
    async with spawn(model_path, "--cache-dir", str(root), "--threads", "2", "--cache-read-only") as eng:
        warm = await eng.score(SHORT_STATE, NEW_QUESTION)
    assert numbers(warm) == short_cold and warm.disk > 0
    assert {p: p.stat().st_mtime_ns for p in root.rglob("*")} == before


async def test_a_fifo_named_like_a_state_file_is_skipped_at_once(model_path, short_state, short_cold, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    root, path = copied(short_state, tmp_path)
    path.unlink()
    os.mkfifo(path)
    caplog.clear()
    async with spawn(model_path, "--cache-dir", str(root), "--threads", "2") as eng:
        with anyio.fail_after(120):  # the old engine blocked in open(2) until a writer came: forever
            for _ in range(2):
                again = await eng.score(SHORT_STATE, NEW_QUESTION)
                assert numbers(again) == short_cold and again.disk == 0
    assert skipped_lines(caplog) == [f"{path} skipped: not a regular file"]  # once, and not removed
    assert path.is_fifo()


async def test_a_sealed_state_header_is_bounded_by_its_length(model_path, short_state, short_cold, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    root, path = copied(short_state, tmp_path)
    data = bytearray(path.read_bytes()[:256])
    data[PAYLOAD_BYTES : PAYLOAD_BYTES + 8] = struct.pack("<Q", 3 << 30)
    data[248:256] = hashlib.sha256(bytes(data[:248])).digest()[:8]
    path.write_bytes(bytes(data))
    os.truncate(path, 256 + (3 << 30))
    caplog.clear()
    async with spawn(model_path, "--cache-dir", str(root), "--threads", "2") as eng:
        again = await eng.score(SHORT_STATE, NEW_QUESTION)
    assert numbers(again) == short_cold and again.disk == 0
    (line,) = skipped_lines(caplog)
    assert line.startswith(f"{path} skipped: its header says 3221225472 payload bytes, more than such a file holds")
    assert line.endswith("; removed") and not path.exists()
