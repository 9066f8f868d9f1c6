"""InlineGauge, the pure decision between running a version's batches inline or on the executor."""

from __future__ import annotations

from agent.scheduling.inline_gauge import PROBE_RUNS, InlineGauge

LIMIT = 100_000  # CPU bar, ns; leaving takes 200 µs. Wall: in under 1 ms, out at 2 ms twice
FAST_CPU = 20_000
FAST_WALL = 30_000


def on_executor(
    gauge: InlineGauge, runs: int, *, cpu: int = FAST_CPU, wall: int = FAST_WALL
) -> None:
    for _ in range(runs):
        gauge.measured(cpu, wall, on_loop=False)


def test_a_fast_model_moves_inline_after_its_probe_runs() -> None:
    gauge = InlineGauge(LIMIT)
    on_executor(gauge, PROBE_RUNS - 1)
    assert not gauge.inline
    on_executor(gauge, 1)
    assert gauge.inline


def test_a_slow_first_run_only_delays_the_move() -> None:
    gauge = InlineGauge(LIMIT)
    on_executor(gauge, 1, cpu=2_000_000, wall=3_000_000)  # ONNX Runtime's first run
    on_executor(gauge, PROBE_RUNS - 1)
    assert not gauge.inline  # the CPU average still holds the first run
    for _ in range(20):
        on_executor(gauge, 1)
        if gauge.inline:
            break
    assert gauge.inline


def test_executor_wall_times_inflated_by_a_busy_loop_do_not_keep_a_tiny_model_off_it() -> None:
    # On the executor the wall time holds the wait for the GIL: a busy event loop makes most of
    # them milliseconds long. One quick one shows what the model itself takes.
    gauge = InlineGauge(LIMIT)
    on_executor(gauge, PROBE_RUNS, wall=4_000_000)
    assert not gauge.inline
    on_executor(gauge, 1, wall=FAST_WALL)
    assert gauge.inline


def test_a_model_that_waits_for_its_device_stays_on_the_executor() -> None:
    gauge = InlineGauge(LIMIT)
    on_executor(gauge, 50, wall=1_500_000)  # little CPU, 1.5 ms of wall time every time
    assert not gauge.inline


def test_one_stall_on_the_loop_keeps_it_inline_two_in_a_row_move_it_back() -> None:
    gauge = InlineGauge(LIMIT)
    on_executor(gauge, PROBE_RUNS)
    assert gauge.inline
    gauge.measured(FAST_CPU, 5_000_000, on_loop=True)  # preempted by the OS once
    gauge.measured(FAST_CPU, FAST_WALL, on_loop=True)
    gauge.measured(FAST_CPU, 5_000_000, on_loop=True)
    assert gauge.inline  # not in a row
    gauge.measured(FAST_CPU, 5_000_000, on_loop=True)
    assert not gauge.inline
    # Back on the executor, a quick execution brings it back.
    on_executor(gauge, 1)
    assert gauge.inline


def test_a_model_that_started_waiting_for_its_device_leaves_and_stays_away() -> None:
    gauge = InlineGauge(LIMIT)
    on_executor(gauge, PROBE_RUNS)
    gauge.measured(FAST_CPU, 5_000_000, on_loop=True)
    gauge.measured(FAST_CPU, 5_000_000, on_loop=True)
    assert not gauge.inline
    on_executor(gauge, 20, wall=5_000_000)
    assert not gauge.inline


def test_inline_walls_between_the_limit_and_twice_it_do_not_move_it_back() -> None:
    gauge = InlineGauge(LIMIT)
    on_executor(gauge, PROBE_RUNS)
    for _ in range(10):
        gauge.measured(FAST_CPU, 1_500_000, on_loop=True)
    assert gauge.inline


def test_a_cpu_average_between_the_bars_keeps_it_where_it_is() -> None:
    gauge = InlineGauge(LIMIT)
    on_executor(gauge, PROBE_RUNS)
    assert gauge.inline
    for _ in range(20):
        gauge.measured(150_000, 150_000, on_loop=True)
    assert gauge.inline  # over the bar to enter, under the one to leave
    gauge.measured(600_000, 600_000, on_loop=True)
    assert not gauge.inline
    on_executor(gauge, 20, cpu=150_000)
    assert not gauge.inline  # back on the executor, the same average does not bring it in


def test_a_cpu_heavy_execution_on_the_loop_moves_it_back_at_once() -> None:
    gauge = InlineGauge(LIMIT)
    on_executor(gauge, PROBE_RUNS)
    gauge.measured(40_000_000, 40_000_000, on_loop=True)
    assert not gauge.inline
    on_executor(gauge, 1)  # the CPU average is still high
    assert not gauge.inline
    on_executor(gauge, 30)
    assert gauge.inline


def test_a_zero_limit_never_moves_inline() -> None:
    gauge = InlineGauge(0)
    on_executor(gauge, 20, cpu=0, wall=0)
    assert not gauge.inline
