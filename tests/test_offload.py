"""KV offload to CPU (kvlab.offload) as vLLM's OffloadingConnector does it: every block that fills is stored to an LRU
CPU tier of a given size; a request being admitted loads the blocks that follow its GPU prefix-cache hit from it.
Tiny pools at exact block ids; the CPU tier's LRU order; invariants on any input; the run scheduler equal to
stepping with it on; bad sizes refused in one line."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab import service
from kvlab.config import resolve
from kvlab.config.engine import SchedulerConfig
from kvlab.offload.allocator import OffloadingPagedAllocator
from kvlab.offload.manager import CPUOffloadingManager
from kvlab.sched.scheduler import Scheduler
from kvlab.sched.seq import Seq, SeqStatus
from kvlab.sim import Simulation
from kvlab.strategies import parse_strategy
from kvlab.workload import Workload
from kvlab.workload.request import Request


def test_the_cpu_tier_is_lru_and_skips_what_it_holds():
    cpu = CPUOffloadingManager(3)
    assert cpu.prepare_store(["a", "b"]) == ["a", "b"]
    assert cpu.prepare_store(["b", "c"]) == ["c"]  # b is stored already: skipped, not touched
    assert cpu.stored_hashes() == ["a", "b", "c"]
    cpu.touch(["a"])
    assert cpu.prepare_store(["d"]) == ["d"]  # b, the least recently used, is evicted
    assert cpu.stored_hashes() == ["c", "a", "d"] and cpu.num_evicted_blocks == 1
    assert cpu.lookup(["c", "a", "x", "d"]) == 2  # a prefix: the load is consecutive
    assert cpu.prepare_store(["w", "x", "y", "z"]) is None  # more than the tier: nothing stored
    assert cpu.stored_hashes() == ["c", "a", "d"] and cpu.num_stored_blocks == 4


def _tiny(num_cpu_blocks=5):
    allocator = OffloadingPagedAllocator(6, 4, num_cpu_blocks=num_cpu_blocks, block_bytes=100, max_model_len=64)
    sched = Scheduler(SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64), allocator)
    return sched, allocator


def _serve(sched, seq):
    sched.add_request(seq)
    sched.update_from_output(sched.schedule(), 1.0)


def test_blocks_are_stored_as_they_fill_and_a_hit_evicted_from_the_gpu_loads_from_the_cpu():
    sched, allocator = _tiny()
    shared = {"prefix_hashes": (7,), "prefix_chunk_len": 8}  # the first 8 tokens: blocks 0 and 1, hashes 0 and 1
    a = Seq(Request(0, 0.0, 9, 1, **shared))
    _serve(sched, a)  # blocks 1, 2, 3; blocks 1 and 2 full after the prompt: stored
    assert a.status is SeqStatus.FINISHED
    assert allocator.cpu.stored_hashes() == [0, 1]
    assert allocator.free_block_ids() == [3, 4, 5, 2, 1]
    b = Seq(Request(1, 0.0, 13, 1))  # unique: blocks 3, 4, 5, 2 (block 2's hash 1 evicted from the GPU)
    _serve(sched, b)
    assert allocator.cpu.stored_hashes() == [0, 1, (1, 0), (1, 1), (1, 2)]  # its 3 full blocks stored too
    assert allocator.block_hash(1) == 0 and allocator.block_hash(2) is None
    c = Seq(Request(2, 0.0, 10, 3, **shared))
    _serve(sched, c)
    # Hash 0 hits on the GPU (block 1), hash 1 in the CPU tier: loaded into a new block (2); block 5 for the rest.
    assert allocator.get_block_ids(2) == [1, 2, 5]
    assert c.num_cached_tokens == 8 and c.num_computed_tokens == 10
    assert allocator.block_hash(2) == 1  # the loaded block is cached on the GPU again
    stats = allocator.offload_stats()
    assert (stats["gpu_prefix_hit_tokens"], stats["cpu_prefix_hit_tokens"]) == (4, 4)
    assert (stats["offload_loaded_blocks"], stats["offload_loaded_bytes"]) == (1, 100)
    assert allocator.take_load_bytes() == 100 and allocator.take_load_bytes() == 0
    assert allocator.cpu.stored_hashes() == [0, (1, 0), (1, 1), (1, 2), 1]  # the load touched hash 1
    allocator.check_invariants([c])


def test_a_full_cpu_tier_evicts_its_least_recently_used():
    sched, allocator = _tiny(num_cpu_blocks=3)
    _serve(sched, Seq(Request(0, 0.0, 9, 1)))  # (0, 0), (0, 1) stored
    _serve(sched, Seq(Request(1, 0.0, 9, 1)))  # (1, 0), (1, 1): (0, 0) evicted
    assert allocator.cpu.stored_hashes() == [(0, 1), (1, 0), (1, 1)]
    assert allocator.offload_stats()["offload_evicted_blocks"] == 1


def _sessions(num_gpu_blocks, size_gib, n=250, **options):
    config = resolve(model="llama-3.1-8b", gpu="h100-sxm", workload="sessions", num_requests=n, rate=4.0,
                     system_prompt_len=1000, num_gpu_blocks=num_gpu_blocks, max_model_len=8192, seed=3,
                     kv_offloading_size=size_gib, **options)
    return config.engine, service.load(config)


def test_a_cpu_tier_turns_recomputation_into_loads_on_a_multi_turn_workload():
    config, workload = _sessions(1500, 2.0)
    plain_config = dataclasses.replace(config, offload=None)
    strategy = parse_strategy("vllm+prefix")
    with_tier = Simulation(strategy, config, workload).run()
    without = Simulation(strategy, plain_config, workload).run()
    stats = with_tier.summary()
    assert stats["cpu_prefix_hit_tokens"] > 0 and stats["offload_evicted_blocks"] > 0
    assert stats["cpu_prefix_hit_tokens"] == stats["offload_loaded_blocks"] * 16
    assert stats["offload_stored_bytes"] == stats["offload_stored_blocks"] * config.offload.block_bytes
    assert "cpu_prefix_hit_tokens" not in without.summary()
    assert with_tier.summary()["ttft_s"]["p50"] < without.summary()["ttft_s"]["p50"]


def _stored_content(allocator) -> list:
    """The CPU tier's blocks, LRU first, by content: a shared block's hash is interned in the order the allocator
    first met it (a run meets them request by request, stepping iteration by iteration), so it is named here by
    its parent's content, its prefix ids and offset."""
    keys = {interned: key for key, interned in allocator._prefix_block_hashes.items()}
    content: dict = {}
    for interned in sorted(keys):  # (a parent is interned before its children)
        parent, *rest = keys[interned]
        content[interned] = (None if parent is None else content[parent], *rest)
    return [content.get(h, h) if isinstance(h, int) else h for h in allocator.cpu.stored_hashes()]


def test_the_run_scheduler_with_a_cpu_tier_is_stepping():
    config, workload = _sessions(1200, 1.0, n=300)
    strategy = parse_strategy("vllm+prefix")
    stepped = Simulation(strategy, config, workload, max_iterations=1)
    runs = Simulation(strategy, config, workload)
    sizes = []
    schedule = runs.scheduler.schedule

    def counted(*args):
        out = schedule(*args)
        sizes.append(out.num_iterations)
        return out

    runs.scheduler.schedule = counted
    t = stepped.start_time
    while not (stepped.done and runs.done):
        t += 7.3
        stepped.run_until(t)
        runs.run_until(t)
        assert runs.now == stepped.now
        assert _stored_content(runs.allocator) == _stored_content(stepped.allocator)
        assert runs.allocator.free_block_ids() == stepped.allocator.free_block_ids()
    a, b = stepped.result(), runs.result()
    assert b.records == a.records and b.counters == a.counters
    assert a.counters.kv_offload["offload_evicted_blocks"] > 0 and a.counters.kv_offload["cpu_prefix_hit_tokens"] > 0
    for name, column in a.log.columns.items():
        assert list(b.log.columns[name]) == list(column), name
    assert max(sizes) > 1  # (runs did run)


@pytest.mark.parametrize("args, message", [
    (["vllm+prefix", "--kv-offloading-size", "5000"], "--kv-offloading-size 5000 GiB is more than the machine's CPU "
     "memory (128 GiB"),
    (["vllm+prefix", "--kv-offloading-size", "300", "--cpu-memory-gib", "256"], "more than the machine's CPU memory "
     "(256 GiB, --cpu-memory-gib)"),
    (["vllm+prefix", "--kv-offloading-size", "0"], "--kv-offloading-size 0 is out of range"),
    # trial 51, finding 12: the size in GiB as given, the least in GiB; a --cpu-memory-gib given is to be larger
    (["vllm+prefix", "--kv-offloading-size", "0.00001"], "--kv-offloading-size 1e-05 GiB holds no KV block (12.5 MiB "
     "each); valid: at least 0.0123 GiB, one block"),
    (["vllm+prefix", "--kv-offloading-size", "8", "--cpu-memory-gib", "4"], "valid: at most 4 GiB, or a larger "
     "--cpu-memory-gib"),
    (["vllm+prefix", "--kv-offloading-size", "-1"], "--kv-offloading-size -1 is out of range"),
    (["vllm+noprefix", "--kv-offloading-size", "8"], "KV offload needs prefix caching"),
    (["orca-max", "--kv-offloading-size", "8"], "KV offload to CPU (--kv-offloading-size) needs paged memory with "
     "prefix caching, as vLLM's; strategy 'orca-max' reserves slabs"),
    # a swap space above 70% of the machine's CPU memory, as vLLM refuses it (CacheConfig.verify_with_parallel_config)
    (["vllm+swap", "--swap-space", "100", "--cpu-memory-gib", "16"], "--swap-space 100 GiB is more than 70% of the "
     "machine's CPU memory (16 GiB, --cpu-memory-gib), a swap space vLLM refuses as too large; valid: --swap-space at "
     "most 11.2, or --cpu-memory-gib at least 142.9"),
    (["vllm+swap", "--swap-space", "100", "--cpu-memory-gib", "128", "--kv-offloading-size", "4"], "--swap-space 100 "
     "GiB is more than 70% of the machine's CPU memory (128 GiB"),
    (["vllm", "--preemption-mode", "swap", "--swap-space", "100"], "--swap-space 100 GiB is more than 70% of the "
     "machine's CPU memory (128 GiB, 1 x A100-40GB's reference server)"),
    (["vllm+swap", "--cpu-memory-gib", "5"], "--swap-space 4 GiB is more than 70% of the machine's CPU memory (5 GiB"),
])
def test_bad_offload_settings_are_named_in_one_line(kvlab, args, message):
    r = kvlab("run", *args, "-n", "10", "--rate", "1")
    assert r.exit_code == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_the_swap_space_is_bounded_by_the_machines_cpu_memory_over_the_tensor_parallel_gpus():
    """vLLM's rule: swap space per GPU x TP at most 70% of the host's CPU memory; --cpu-memory-gib states it, and
    travels in the options (without a CPU tier too) so that a resolved configuration resolves again."""
    from kvlab.errors import KvlabError

    swapping = {"model": "llama-3.1-8b", "gpu": "h100-sxm", "preemption_mode": "swap", "cpu_memory_gib": 16.0}
    config = resolve(swapping, swap_space=11.2)  # 11.2 GiB = 70% of 16: the most vLLM takes
    assert config.cpu_memory_gib == 16.0 and config.offload is None
    assert resolve(config.options()) == config and resolve(config.options()).key == config.key
    with pytest.raises(KvlabError, match=r"--swap-space 6 GiB per GPU x 2 GPUs \(TP\) = 12 GiB is more than 70% of the "
                       r"machine's CPU memory \(16 GiB, --cpu-memory-gib\).*at most 5.6, or --cpu-memory-gib at least "
                       r"17.2$"):
        resolve(swapping, swap_space=6.0, tensor_parallel_size=2)
    with pytest.raises(KvlabError, match="more than 70%"):
        resolve(swapping, swap_space=11.3)
    # a strategy that does not swap leaves the swap space unused: nothing to refuse
    assert resolve({**swapping, "preemption_mode": None}, swap_space=100.0).cpu_memory_gib == 16.0


def test_a_cpu_memory_that_bounds_nothing_is_said_to_be_unused(kvlab):
    r = kvlab("run", "vllm+prefix", "--cpu-memory-gib", "64", "-n", "10", "--rate", "1")
    assert r.exit_code == 0, r.stderr
    assert "--cpu-memory-gib 64 is not used: it bounds a CPU tier (--kv-offloading-size) and a swapping strategy's " \
           "--swap-space, and there is neither" in " ".join((r.stdout + r.stderr).split())


def test_the_tier_holds_size_over_a_blocks_bytes():
    config = resolve(model="llama-3.1-8b", gpu="h100-sxm", kv_offloading_size=8.0)
    offload = config.offload
    assert offload.block_bytes == 16 * 131072  # 32 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes, 16 tokens
    assert offload.num_cpu_blocks == 4096 and offload.link == "PCIe 5.0 x16"
    assert offload.seconds(offload.block_bytes) == pytest.approx(2 * 2**20 / 64e9)
    assert resolve(config.options()).offload == offload


@settings(max_examples=40, deadline=None)
@given(specs=st.lists(st.tuples(st.floats(0, 3), st.integers(1, 200), st.integers(1, 100), st.integers(0, 3),
                                st.one_of(st.none(), st.floats(0.05, 3))), min_size=1, max_size=25),
       num_blocks=st.integers(30, 60), num_cpu_blocks=st.integers(1, 40))
def test_no_block_is_lost_and_every_request_ends_with_a_cpu_tier(specs, num_blocks, num_cpu_blocks):
    from kvlab.offload.config import OffloadConfig

    config = resolve(model="llama-2-7b", gpu="a100-80gb", num_gpu_blocks=num_blocks, block_size=16,
                     max_model_len=1024, max_num_batched_tokens=1024).engine
    config = dataclasses.replace(config, offload=OffloadConfig(num_cpu_blocks, 1000, "PCIe 4.0 x16", 32e9))
    requests = sorted((Request(i, t, p, o, timeout=to, prefix_hashes=(g, g + 1) if g else (), prefix_chunk_len=48)
                       for i, (t, p, o, g, to) in enumerate(specs)), key=lambda r: (r.arrival_time, r.request_id))
    workload = Workload("h", tuple(dataclasses.replace(r, request_id=i) for i, r in enumerate(requests)), "", "")
    sim = Simulation(parse_strategy("vllm+prefix"), config, workload, max_iterations=1)
    while not sim.done:
        if sim.step() is None:
            break
        sim.allocator.check_invariants(sim.scheduler.running, in_running_order=True)
        assert len(sim.allocator.cpu.stored_hashes()) <= num_cpu_blocks
    result = sim.result()
    assert {r.status for r in result.records} <= {"finished", "aborted", "rejected"}
    assert len(result.records) == len(requests)
    assert sim.allocator.num_free_blocks == num_blocks - 1
    runs = Simulation(parse_strategy("vllm+prefix"), config, workload).run()
    assert runs.records == result.records and runs.counters == result.counters


def test_a_setup_names_its_cpu_tier():
    """A report's setup line says the CPU tier a run had (and none without one)."""
    from kvlab.config import resolve
    from kvlab.report.setup import setup_lines

    with_tier = resolve(model="llama-3.1-8b", gpu="h100-sxm", num_gpu_blocks=3000, kv_offloading_size=8)
    assert with_tier.describe()["cpu_tier"] == {"size_gib": 8.0, "num_cpu_blocks": 4096, "link": "PCIe 5.0 x16"}
    assert "CPU tier: 8 GiB, 4,096 blocks over PCIe 5.0 x16 (--kv-offloading-size)" in setup_lines(with_tier.describe())
    without = resolve(model="llama-3.1-8b", gpu="h100-sxm", num_gpu_blocks=3000).describe()
    assert "cpu_tier" not in without and not any(line.startswith("CPU tier") for line in setup_lines(without))


def test_a_swap_space_and_a_cpu_tier_are_checked_together_against_the_machine(kvlab):
    """trial 51, finding 10: each was checked alone (offload <= 128 GiB, swap <= 70% of 128), so 120 + 80 = 200 GiB
    of pinned CPU memory ran on A100-40GB's reference server of 128 GiB."""
    r = kvlab("run", "vllm+swap", "-n", "5", "--kv-offloading-size", "49", "--swap-space", "80")
    assert r.exit_code == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines()[-1] == (
        "error: --swap-space 80 GiB and --kv-offloading-size 49 GiB take 129 GiB of CPU memory together, more than "
        "the machine's 128 GiB (1 x A100-40GB's reference server); valid: a swap space and a CPU tier of at most 128 "
        "GiB together, or --cpu-memory-gib at least 129")
    assert kvlab("run", "vllm+swap", "-n", "5", "--kv-offloading-size", "48", "--swap-space", "80").exit_code == 0
    assert kvlab("run", "vllm+swap", "-n", "5", "--kv-offloading-size", "49", "--swap-space", "80",
                 "--cpu-memory-gib", "129").exit_code == 0
    # a strategy that does not swap holds no swap space: nothing to add up
    assert kvlab("run", "vllm", "-n", "5", "--kv-offloading-size", "120", "--swap-space", "80").exit_code == 0
