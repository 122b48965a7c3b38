"""RL environments (meltemi.levanter.envs): prompt order, rewards, guarded scoring, the sandbox.

A verifier that raises, hangs, returns NaN or a non-number, or whose subprocess crashes or runs
out of memory scores 0.0 with a counted reason, never an exception. The code sandbox is checked
from the outside: a listening socket it must not reach, a forked child it must not leave behind.
"""

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time

import pytest

from meltemi.levanter import envs
from meltemi.levanter.envs import Prompt, Score


class _Fixed(envs.Environment):
    """Three prompts whose reward function is whatever the test says."""

    def __init__(self, reward_fn, name="fixed"):
        self.name = name
        self._reward = reward_fn

    def size(self, split):
        self.check_split(split)
        return 3

    def prompt(self, split, index):
        self.check_split(split, index)
        return Prompt(f"{self.name}/{split}/{index}", f"q{index}", f"a{index}", self.name)

    def reward(self, prompt, response):
        return self._reward(prompt, response)


_P = Prompt("fixed/train/0", "q0", "a0", "fixed")


# --- guarded scoring --------------------------------------------------------------------------


def _raise(prompt, response):
    raise RuntimeError("verifier bug")


def _nan(prompt, response):
    return float("nan")


def _inf(prompt, response):
    return float("-inf")


def _text(prompt, response):
    return "1.0"


_HANG = threading.Event()


def _hang(prompt, response):
    _HANG.wait(60)
    return 1.0


@pytest.mark.parametrize(
    ("reward_fn", "reason"),
    [(_raise, "raised"), (_nan, "nan"), (_inf, "nan"), (_text, "bad_type"), (_hang, "timeout")],
)
def test_a_failing_verifier_scores_zero_with_its_reason(reward_fn, reason):
    start = time.monotonic()
    got = envs.score(_Fixed(reward_fn), _P, "a0", timeout_s=0.3)
    assert got == Score(0.0, reason)
    assert time.monotonic() - start < 5


@pytest.mark.parametrize(("value", "expect"), [(True, 1.0), (False, 0.0), (1, 1.0), (0.25, 0.25)])
def test_a_bool_or_int_reward_is_a_number(value, expect):
    assert envs.score(_Fixed(lambda p, r: value), _P, "a0") == Score(expect)


def test_failures_are_counted_per_reason_and_good_scores_pass_through():
    def mixed(prompt, response):
        return (
            {"ok": 1.0, "half": 0.5, "boom": _raise, "nan": float("nan")}[response]
            if (response != "boom")
            else _raise(prompt, response)
        )

    env = _Fixed(mixed)
    scores = envs.score_many(env, [_P] * 5, ["ok", "half", "boom", "nan", "boom"], timeout_s=5)
    assert [s.reward for s in scores] == [1.0, 0.5, 0.0, 0.0, 0.0]
    counts = envs.failure_counts(scores)
    assert counts == {"raised": 2, "timeout": 0, "nan": 1, "bad_type": 0, "crashed": 0, "memory": 0}
    with pytest.raises(ValueError, match=r"2 prompts but 1 responses: pass one response"):
        envs.score_many(env, [_P, _P], ["x"])


def test_score_many_in_parallel_keeps_the_order():
    def slow(prompt, response):
        time.sleep(0.4)
        return float(response)

    responses = ["0.1", "0.2", "0.3", "0.4", "0.5", "0.6"]
    start = time.monotonic()
    scores = envs.score_many(_Fixed(slow), [_P] * 6, responses, max_workers=6)
    assert [s.reward for s in scores] == [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
    assert time.monotonic() - start < 6 * 0.4  # not one after the other
    with pytest.raises(ValueError, match=r"max_workers=0: must be >= 1"):
        envs.score_many(_Fixed(slow), [_P], ["1"], max_workers=0)


def test_envs_import_and_score_without_jax():
    code = (
        "import sys\n"
        "sys.modules['jax'] = None  # any import of jax now fails\n"
        "from meltemi.levanter import envs\n"
        "env = envs.ArithmeticEnv(max_operand=5)\n"
        "p = envs.PromptSource(env, seed=1)[0]\n"
        "print(envs.score(env, p, p.target).reward)\n"
    )
    path = os.pathsep.join(p for p in sys.path if p)
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": path},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1.0"


# --- prompt order -----------------------------------------------------------------------------


def test_prompt_source_is_deterministic_by_seed_and_resumable_at_any_cursor():
    env = envs.ArithmeticEnv(max_operand=6, ops="+")
    a = envs.PromptSource(env, seed=3).batch(0, 100)
    b = envs.PromptSource(env, seed=3)
    assert [b[i] for i in range(60, 100)] == a[60:]  # a fresh source resumed at cursor 60
    assert [p.id for p in envs.PromptSource(env, seed=4).batch(0, 100)] != [p.id for p in a]


def test_each_epoch_visits_every_prompt_once_in_a_new_order():
    env = envs.ArithmeticEnv(max_operand=6, ops="+")
    n = env.size("train")
    ids = [p.id for p in envs.PromptSource(env, seed=0).batch(0, 3 * n)]
    epochs = [ids[i * n : (i + 1) * n] for i in range(3)]
    assert all(sorted(e) == sorted(epochs[0]) and len(set(e)) == n for e in epochs)
    assert epochs[0] != epochs[1] != epochs[2]


def test_prompt_source_errors_name_the_fix():
    env = envs.ArithmeticEnv(max_operand=3)
    with pytest.raises(ValueError, match=r"split='dev': unknown; use one of \('train', 'test'\)"):
        envs.PromptSource(env, "dev")
    with pytest.raises(ValueError, match=r"index=-1: the prompt cursor counts from 0"):
        envs.PromptSource(env)[-1]
    with pytest.raises(ValueError, match=r"index=99: arithmetic has \d+ test prompts; use 0 <="):
        env.prompt("test", 99)


# --- arithmetic -------------------------------------------------------------------------------


def test_arithmetic_prompts_answers_and_held_out_split():
    env = envs.ArithmeticEnv(max_operand=12, ops="+-*", test_fraction=0.1)
    train = [env.prompt("train", i) for i in range(env.size("train"))]
    test = [env.prompt("test", i) for i in range(env.size("test"))]
    assert len(train) + len(test) == 3 * 13 * 13 and len(test) == round(0.1 * 3 * 13 * 13)
    assert not {p.text for p in train} & {p.text for p in test}
    for p in train + test:
        a, op, b = p.text[:-1].partition("+")
        if not op:
            a, op, b = p.text[:-1].rpartition("-") if "-" in p.text else p.text[:-1].partition("*")
        expect = {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op]
        assert p.target == str(expect) and p.text.endswith("=")
    # Same split on every construction; a different split_seed, a different split.
    assert envs.ArithmeticEnv(max_operand=12, ops="+-*").prompt("test", 0) == test[0]
    assert envs.ArithmeticEnv(max_operand=12, ops="+-*", split_seed=1).prompt("test", 0) != test[0]


def test_carry_free_arithmetic_keeps_exactly_the_problems_without_a_carry_or_borrow():
    env = envs.ArithmeticEnv(max_operand=99, ops="+-", carries=False)
    problems = {env.prompt(s, i).text for s in ("train", "test") for i in range(env.size(s))}
    # the column rule, written out digit by digit (operands < 100: two columns)
    expect = {
        f"{a}{op}{b}="
        for op in "+-"
        for a in range(100)
        for b in range(100)
        if all(
            (x + y <= 9) if op == "+" else (x >= y)
            for x, y in ((a % 10, b % 10), (a // 10, b // 10))
        )
    }
    assert problems == expect and len(expect) == 2 * 55 * 55

    # held out: new numbers, every column fact of which (digit op digit) is in training too
    def facts(split):
        out = set()
        for i in range(env.size(split)):
            a, op, b = re.fullmatch(r"(\d+)([+-])(\d+)=", env.prompt(split, i).text).groups()
            out |= {(x, op, y) for x, y in zip(a.zfill(2), b.zfill(2))}
        return out

    train = {env.prompt("train", i).text for i in range(env.size("train"))}
    assert not train & {env.prompt("test", i).text for i in range(env.size("test"))}
    assert facts("test") <= facts("train")


@pytest.mark.parametrize(
    ("response", "reward"),
    [
        ("19", 1.0),
        (" 19 ", 1.0),
        ("19\n3+4=7", 1.0),
        ("190", 0.0),
        ("1 9", 0.0),
        ("", 0.0),
        ("-19", 0.0),
        ("19.0", 0.0),
    ],
)
def test_arithmetic_reward_is_exact_match_of_the_first_line(response, reward):
    env = envs.ArithmeticEnv()
    p = Prompt("arithmetic/train/0", "12+7=", "19", "arithmetic")
    assert envs.score(env, p, response) == Score(reward)


def test_arithmetic_config_errors_name_the_fix():
    with pytest.raises(ValueError, match=r"ops='\+/': '/' is not one of \+-\*"):
        envs.ArithmeticEnv(ops="+/")
    with pytest.raises(ValueError, match=r"max_operand=0: must be >= 1"):
        envs.ArithmeticEnv(max_operand=0)
    with pytest.raises(ValueError, match=r"test_fraction=1.5: must be in \(0, 1\)"):
        envs.ArithmeticEnv(test_fraction=1.5)
    with pytest.raises(ValueError, match=r"ops='\+\*' with carries=False: '\*' has no carry-free"):
        envs.ArithmeticEnv(ops="+*", carries=False)
    with pytest.raises(ValueError, match=r"retries=-1: must be >= 0 \(0: one turn\)"):
        envs.ArithmeticEnv(retries=-1)


def test_arithmetic_with_retries_answers_a_wrong_turn_until_its_retries_are_spent():
    env = envs.ArithmeticEnv(max_operand=9, ops="+", retries=2)
    p = env.prompt("train", 0)  # 8+2= -> 10
    assert env.step(p, ["11"]) == "\nno, try again: 8+2="
    assert env.step(p, ["11", "12"]) == "\nno, try again: 8+2="
    assert env.step(p, ["11", "12", "13"]) is None  # 2 retries spent: 3 turns in all
    assert env.step(p, ["10"]) is None and env.step(p, ["11", "10"]) is None  # right: done
    assert envs.ArithmeticEnv(max_operand=9, ops="+").step(p, ["11"]) is None  # one turn


# --- math-verify ------------------------------------------------------------------------------

_PROBLEMS = [
    ("What is 1/2 + 1/4?", "\\frac{3}{4}"),
    ("Compute 2^10.", "1024"),
    ("Solve x^2 = 9 for x > 0.", "3"),
    ("What is 0.1 + 0.2?", "0.3"),
    ("Simplify sqrt(8).", "2\\sqrt{2}"),
]


@pytest.mark.parametrize(
    ("index", "response", "reward"),
    [
        (0, "So the sum is $\\boxed{0.75}$.", 1.0),
        (0, "$\\boxed{\\frac{6}{8}}$", 1.0),
        (0, "$\\boxed{\\frac{2}{3}}$", 0.0),
        (1, "The answer is $2^{10} = \\boxed{1024}$", 1.0),
        (3, "$\\boxed{\\frac{3}{10}}$", 1.0),
        (4, "$\\boxed{\\sqrt{8}}$", 1.0),
        (4, "$\\boxed{2}$", 0.0),
        (2, "no idea", 0.0),
    ],
)
def test_math_answers_are_checked_by_math_verify(index, response, reward):
    env = envs.MathEnv(_PROBLEMS)
    question, answer = _PROBLEMS[index]
    p = Prompt(f"math/x/{index}", question, answer, "math")
    assert envs.score(env, p, response) == Score(reward)


def test_math_from_jsonl_and_its_errors(tmp_path):
    path = tmp_path / "math.jsonl"
    path.write_text("\n".join(json.dumps({"question": q, "answer": a}) for q, a in _PROBLEMS))
    env = envs.MathEnv.from_jsonl(path, test_fraction=0.2)
    got = {env.prompt(s, i).text for s in envs.SPLITS for i in range(env.size(s))}
    assert got == {q for q, _ in _PROBLEMS} and env.size("test") == 1
    path.write_text('{"question": "1+1"}\n')
    with pytest.raises(ValueError, match=r"math.jsonl:1: expected \{\"question\": ..., \"answer\""):
        envs.MathEnv.from_jsonl(path)
    with pytest.raises(ValueError, match=r"problems\[1\]=\('q', ''\): each problem is a"):
        envs.MathEnv([("a", "1"), ("q", "")])


# --- code in a sandbox ------------------------------------------------------------------------

_TESTS = "assert add(2, 3) == 5\nassert add(-1, 1) == 0\n"
_CODE = Prompt("code/train/0", "Write add(a, b).", _TESTS, "code")


@pytest.fixture(scope="module")
def code_env():
    return envs.CodeEnv([("Write add(a, b).", _TESTS)] * 5, timeout_s=1.5, memory_mb=256)


@pytest.mark.parametrize(
    ("response", "expect"),
    [
        ("def add(a, b):\n    return a + b\n", Score(1.0)),
        ("Here:\n```python\ndef add(a, b):\n    return a + b\n```\nDone.", Score(1.0)),
        ("def add(a, b):\n    return a - b\n", Score(0.0)),
        ("this is not python", Score(0.0)),
        ("while True:\n    pass\n", Score(0.0, "timeout")),
        ("import time\ntime.sleep(30)\n", Score(0.0, "timeout")),
        ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n", Score(0.0, "crashed")),
        ("import ctypes\nctypes.string_at(0)\n", Score(0.0, "crashed")),
        ("x = bytearray(1 << 30)\n", Score(0.0, "memory")),
    ],
)
def test_code_is_scored_by_its_unit_tests_under_limits(code_env, response, expect):
    start = time.monotonic()
    assert envs.score(code_env, _CODE, response, timeout_s=30) == expect
    assert time.monotonic() - start < 10


def test_code_runs_in_a_fresh_temporary_directory_with_an_empty_environment():
    result = envs.run_sandboxed(
        "import os\nopen('left.txt', 'w').write('x')\nprint(os.getcwd())\n"
        "print(sorted(os.environ))\n",
        timeout_s=5,
    )
    cwd, env_keys = result.stdout.splitlines()
    assert result.returncode == 0 and cwd != os.getcwd() and "meltemi-code-" in cwd
    assert not os.path.exists(cwd)  # removed afterwards, with what the program wrote
    assert set(eval(env_keys)) <= {"PATH", "HOME", "LANG", "LC_CTYPE"}


def test_a_timed_out_program_leaves_no_child_process_behind():
    result = envs.run_sandboxed(
        "import subprocess, time\np = subprocess.Popen(['sleep', '60'])\n"
        "print(p.pid, flush=True)\ntime.sleep(60)\n",
        timeout_s=1.0,
    )
    assert result.timed_out
    pid = int(result.stdout.split()[0])
    time.sleep(0.2)
    assert not _alive(pid)


def _alive(pid):
    """Running (a killed child whose new parent does not reap it stays a zombie, "Z")."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture(scope="module")
def listener():
    """A TCP server on loopback that a sandboxed program must not reach."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    yield srv.getsockname()[1]
    srv.close()


def _connect(port, raw):
    if raw:  # the C-level socket: only a network namespace stops it
        return (
            f"import _socket\ns = _socket.socket()\ns.settimeout(3)\n"
            f"s.connect(('127.0.0.1', {port}))\nprint('connected')\n"
        )
    return (
        f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=3)\n"
        f"print('connected')\n"
    )


def test_the_listener_is_reachable_outside_the_sandbox(listener):
    # The control: the same programs connect when run plainly, so the tests below can fail.
    for raw in (False, True):
        done = subprocess.run(
            [sys.executable, "-c", _connect(listener, raw)],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.stdout.strip() == "connected", done.stderr


def test_network_namespace_blocks_every_connection(listener):
    if not envs.namespace_available():
        with pytest.raises(ValueError, match=r"network='namespace': `unshare -rn` is not availab"):
            envs.run_sandboxed("pass", network="namespace")
        assert envs.CodeEnv([("d", "t")] * 2, test_fraction=0.5).network_isolation == "guard"
        return
    assert envs.CodeEnv([("d", "t")] * 2, test_fraction=0.5).network_isolation == "namespace"
    for raw in (False, True):
        result = envs.run_sandboxed(_connect(listener, raw), network="namespace", timeout_s=10)
        assert result.returncode == 1 and "connected" not in result.stdout
        assert "Network is unreachable" in result.stderr


def test_socket_guard_blocks_python_sockets(listener):
    result = envs.run_sandboxed(_connect(listener, False), network="guard", timeout_s=10)
    assert result.returncode == 1 and "connected" not in result.stdout
    assert "network access is disabled in the sandbox" in result.stderr


def test_code_env_errors_name_the_fix():
    with pytest.raises(ValueError, match=r"network='off': use one of \('auto', 'namespace'"):
        envs.run_sandboxed("pass", network="off")
    with pytest.raises(ValueError, match=r"memory_mb=16: the interpreter alone needs more"):
        envs.CodeEnv([("d", "t")] * 2, memory_mb=16)
    with pytest.raises(ValueError, match=r"timeout_s=0: must be > 0"):
        envs.CodeEnv([("d", "t")] * 2, timeout_s=0)


def test_extract_code_takes_the_first_fenced_block():
    assert envs.extract_code("a\n```python\nx = 1\n```\n```\ny = 2\n```") == "x = 1\n"
    assert envs.extract_code("```\ny = 2\n```") == "y = 2\n"
    assert envs.extract_code("z = 3") == "z = 3"


# --- multi-turn -------------------------------------------------------------------------------


def test_step_defaults_to_one_turn_and_an_env_can_continue():
    class Guess(_Fixed):
        def step(self, prompt, responses):
            if responses[-1] == prompt.target or len(responses) >= 3:
                return None
            return "higher" if responses[-1] < prompt.target else "lower"

    assert _Fixed(_nan).step(_P, ["x"]) is None
    guess = Guess(lambda p, r: float(r == p.target))
    assert guess.step(_P, ["a"]) == "higher" and guess.step(_P, ["a", "a0"]) is None
    assert guess.step(_P, ["b", "b", "b"]) is None
