"""pygrad.distributed on a real Dask LocalCluster (2 worker processes on loopback): data-parallel programs, MULTI
devices placed on workers, gradients derived on workers, a worker killed in the middle of a call."""
import os, signal, threading, time
import numpy as np
import pytest
import pygrad
from pygrad import UOp, dtypes

distributed = pytest.importorskip("distributed", reason="Dask's distributed is an optional dependency")
from pygrad import distributed as pd  # noqa: E402



@pytest.fixture(scope="module")
def client():
  old = os.environ.get("PYGRAD_NUM_THREADS")
  os.environ["PYGRAD_NUM_THREADS"] = "1"  # the workers' VMs: one thread each, so cores are not counted twice
  try:
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=None, silence_logs=50) as cluster, \
         distributed.Client(cluster) as c:
      c.wait_for_workers(2, timeout=120)
      yield c
  finally:
    if old is None: os.environ.pop("PYGRAD_NUM_THREADS", None)
    else: os.environ["PYGRAD_NUM_THREADS"] = old


def _mlp(chunk, din=8, dh=16, dout=4):
  x = UOp.placeholder((chunk, din), dtypes.float32, name="x")
  y = UOp.placeholder((chunk, dout), dtypes.float32, name="y")
  w1 = UOp.placeholder((din, dh), dtypes.float32, name="w1")
  w2 = UOp.placeholder((dh, dout), dtypes.float32, name="w2")
  out = (x @ w1).relu() @ w2
  loss = ((out - y) * (out - y)).sum()
  g1, g2 = loss.gradient(w1, w2)
  return [loss, g1, g2, out], [x, y, w1, w2]


def _data(n, din=8, dout=4, dh=16, seed=0):
  r = np.random.default_rng(seed)
  return [r.standard_normal((n, din)).astype(np.float32), r.standard_normal((n, dout)).astype(np.float32),
          r.standard_normal((din, dh)).astype(np.float32), r.standard_normal((dh, dout)).astype(np.float32)]


def _sequential(prog, arrays, chunk, red, nbatch=2):
  """What DataParallel promises: the program on each chunk in order, combined in chunk order."""
  n = arrays[0].shape[0] // chunk
  parts = [prog(*[a[i * chunk:(i + 1) * chunk] for a in arrays[:nbatch]], *arrays[nbatch:]) for i in range(n)]
  res = []
  for j, how in enumerate(red):
    ps = [p[j] for p in parts]
    if how == "concat": res.append(np.concatenate(ps))
    else:
      acc = ps[0].copy()
      for p in ps[1:]: acc += p
      res.append(acc / n if how == "mean" else acc)
  return res


RED = ["sum", "mean", "mean", "concat"]


def _dp(client, chunk):
  outs, ins = _mlp(chunk)
  dp = pd.DataParallel(outs, ins, client, batch=[ins[0], ins[1]], reduce=dict(enumerate(RED)))
  return dp, outs, ins


def test_one_chunk_is_compile_bit_for_bit(client):
  dp, outs, ins = _dp(client, 32)
  arrays = _data(32)
  got = dp(*arrays)
  want = pygrad.compile(outs, ins)(*arrays)
  for g, w in zip(got, want): assert g.dtype == w.dtype and np.array_equal(g, w)


def test_chunks_combine_in_order(client):
  dp, outs, ins = _dp(client, 16)
  arrays = _data(96, seed=1)
  got = dp(*arrays)
  want = _sequential(pygrad.compile(outs, ins), arrays, 16, RED)
  for g, w in zip(got, want): assert g.shape == w.shape and np.array_equal(g, w)
  # the whole batch at once agrees within float rounding (a sum over chunks, then over the batch)
  full_outs, full_ins = _mlp(96)
  full = pygrad.compile(full_outs, full_ins)(*arrays)
  np.testing.assert_allclose(got[0], full[0], rtol=1e-4)
  np.testing.assert_allclose(got[3], full[3], rtol=1e-5, atol=1e-5)


def test_compiled_once_per_worker(client):
  outs, ins = _mlp(8)
  before = client.run(pd.worker_stats)
  dp1 = pd.DataParallel(outs, ins, client, batch=[ins[0], ins[1]], reduce=dict(enumerate(RED)))
  for _ in range(3): dp1(*_data(32, seed=2))
  mid = client.run(pd.worker_stats)
  dp2 = pd.DataParallel(outs, ins, client, batch=[ins[0], ins[1]], reduce=dict(enumerate(RED)))
  assert dp2.key == dp1.key
  dp2(*_data(32, seed=3))
  after = client.run(pd.worker_stats)
  assert sum(mid[w]["compiles"] - before[w]["compiles"] for w in mid) <= len(mid)  # at most once per worker
  assert all(after[w]["compiles"] == mid[w]["compiles"] for w in after)  # the second DataParallel compiles nothing
  assert sum(after[w]["runs"] - mid[w]["runs"] for w in after) == 4


def test_dask_arrays_are_used_in_place(client):
  da = pytest.importorskip("dask.array")
  dp, outs, ins = _dp(client, 16)
  arrays = _data(64, seed=4)
  x = da.from_array(arrays[0], chunks=(32, 8))
  y = client.persist(da.from_array(arrays[1], chunks=(16, 4)))
  w1 = client.scatter(arrays[2], broadcast=True)
  got = dp(x, y, w1, arrays[3])
  want = _sequential(pygrad.compile(outs, ins), arrays, 16, RED)
  for g, w in zip(got, want): assert np.array_equal(g, w)


def test_bad_input_fails_on_the_client(client):
  outs, ins = _mlp(8)
  with pytest.raises(ValueError, match="not one of the inputs"):
    pd.DataParallel(outs, ins[1:], client, batch=[ins[0]], reduce=dict(enumerate(RED)))
  with pytest.raises(ValueError, match="no reduction"):
    pd.DataParallel(outs, ins, client, batch=[ins[0]], reduce={0: "sum"})
  with pytest.raises(ValueError, match="not one of"):
    pd.DataParallel(outs, ins, client, batch=[ins[0]], reduce={0: "max", 1: "sum", 2: "sum", 3: "concat"})
  dp = pd.DataParallel(outs, ins, client, batch=[ins[0], ins[1]], reduce=dict(enumerate(RED)))
  arrays = _data(32)
  before = client.run(pd.worker_stats)
  with pytest.raises(ValueError, match="different sizes"):
    dp(arrays[0], arrays[1][:16], *arrays[2:])
  with pytest.raises(ValueError, match="does not split"):
    dp(arrays[0][:12], arrays[1][:12], *arrays[2:])
  with pytest.raises(ValueError, match="expected 4 arrays"):
    dp(*arrays[:3])
  assert client.run(pd.worker_stats) == before  # nothing was sent


def test_worker_killed_mid_call(client):
  n = 128
  x = UOp.placeholder((n, n), dtypes.float32, name="x")
  w = UOp.placeholder((n, n), dtypes.float32, name="w")
  y = x
  for _ in range(8): y = (y @ w).sin()
  loss = y.sum()
  (gw,) = loss.gradient(w)
  dp = pd.DataParallel([loss, gw], [x, w], client, batch=[x], reduce={0: "sum", 1: "sum"}, timeout=240)
  r = np.random.default_rng(5)
  xs = r.standard_normal((n * 64, n)).astype(np.float32) * 0.05
  ws = r.standard_normal((n, n)).astype(np.float32) * 0.05
  want = _sequential(pygrad.compile([loss, gw], [x, w]), [xs, ws], n, ["sum", "sum"], nbatch=1)
  dp(xs[:2 * n], ws)  # compiled on both workers before the kill
  pids = client.run(os.getpid)
  out: dict = {}
  def call():
    try: out["res"] = dp(xs, ws)
    except BaseException as e: out["err"] = e  # noqa: BLE001 -- reported by the assertion below
  t = threading.Thread(target=call)
  runs = lambda: sum(v["runs"] for v in client.run(pd.worker_stats).values())  # noqa: E731
  start = runs()
  t.start()
  deadline = time.monotonic() + 120
  while runs() < start + 2 and time.monotonic() < deadline: time.sleep(0.05)
  assert t.is_alive(), "the call ended before a worker could be killed in its middle"
  victim = sorted(pids)[0]
  os.kill(pids[victim], signal.SIGKILL)
  t.join(timeout=280)
  assert not t.is_alive(), "the call hung after a worker was killed"
  assert "res" in out, f"the call raised {out.get('err')!r}"
  got = out["res"]
  for g, w_ in zip(got, want): assert np.array_equal(g, w_)
  client.wait_for_workers(2, timeout=120)  # the nanny restarts the killed worker for the other tests


def _sharded(devs=("CPU:0", "CPU:1")):
  x = UOp.placeholder((8, 6), dtypes.float32, name="x")
  w = UOp.placeholder((6, 5), dtypes.float32, name="w")
  xs = x.shard(devs, 0)
  h = (xs * 2.0 + 1.0).sin()
  out = h.sum(axis=1)
  return [out, h.copy_to_device("CPU:1").exp2().sum()], [x, w]


def test_evaluate_with_devices_on_workers(client):
  (out, s), (x, w) = _sharded()
  vals = {x: np.random.default_rng(6).standard_normal((8, 6)).astype(np.float32)}
  want = pygrad.evaluate([out, s], vals)
  before = client.run(pd.worker_stats)
  got = pd.evaluate([out, s], vals, client, placement={"CPU": 0, "CPU:0": 0, "CPU:1": 1})
  after = client.run(pd.worker_stats)
  for g, w_ in zip(got, want): np.testing.assert_array_equal(g, w_)
  assert all(after[k]["runs"] > before[k]["runs"] for k in after)  # both workers ran a part
  got_np = pd.evaluate(out, vals, client, engine="numpy")
  np.testing.assert_array_equal(got_np, pygrad.evaluate(out, vals, engine="numpy"))
  with pytest.raises(ValueError, match="not placed"):
    pd.evaluate(out, vals, client, placement={"CPU:0": 0})
  with pytest.raises(ValueError, match="no value bound"):
    pd.evaluate(out, {}, client)


def test_map_gradients_gives_the_local_nodes(client):
  graphs, targets = [], []
  for n in (3, 4, 5, 6):
    a = UOp.placeholder((n, n), dtypes.float32, name="a")
    b = UOp.placeholder((n,), dtypes.float32, name="b")
    graphs.append(((a @ a).sin() + b.reshape((1, n)).expand((n, n))).sum())
    targets.append([a, b])
  remote = pd.map_gradients(client, graphs, targets)
  for g, t, r in zip(graphs, targets, remote):
    local = g.gradient(*t)
    assert len(r) == len(local) and all(x is y for x, y in zip(r, local))


def test_train_data_parallel_reaches_the_single_process_accuracy(capsys):
  """`python -m pygrad train --workers 2`: the digits MLP trained data-parallel on a LocalCluster of 2 processes."""
  pytest.importorskip("sklearn")
  pytest.importorskip("tqdm")
  from pygrad.train import main
  accs = []
  for workers in ("0", "2"):
    assert main(["--steps", "300", "--no-progress", "--workers", workers]) == 0
    out = capsys.readouterr().out
    accs.append(float(out.rsplit("test accuracy ", 1)[1].split("%")[0]))
  assert "2 Dask workers" in out
  assert accs[1] >= 95.0 and abs(accs[1] - accs[0]) <= 1.5, accs


def test_data_parallel_step_is_the_whole_batch_step(client):
  """Averaging the workers' [loss, *new params] gives the whole batch's step (float rounding apart)."""
  from pygrad.train import data_parallel_step, mlp_step, init_params, onehot
  r = np.random.default_rng(7)
  x = r.random((64, 8), dtype=np.float32)
  y = onehot(r.integers(0, 3, 64), 3)
  params = init_params((8, 16, 3))
  got = data_parallel_step((8, 16, 3), 64, 0.1, client)(x, y, *params)
  want = mlp_step((8, 16, 3), 64, 0.1)(x, y, *params)
  for g, w in zip(got, want): np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


class _FakeClient:
  def __init__(self, workers, direct=None, scheduler="tcp://10.0.0.1:8786"):
    self.direct_to_workers, self._ws = direct, workers
    self.scheduler = type("rpc", (), {"address": scheduler})()
  def scheduler_info(self): return {"workers": {w: {} for w in self._ws}}


def test_results_come_straight_from_workers_only_where_they_are_reachable():
  # loopback workers are reachable: no hop through the scheduler
  assert pd._direct(_FakeClient(["tcp://127.0.0.1:4001", "tcp://127.0.0.1:4002"])) is True
  # workers elsewhere (a cluster the client may sit outside of, as on Kubernetes): Dask's default, via the scheduler
  assert pd._direct(_FakeClient(["tcp://127.0.0.1:4001", "tcp://10.0.0.7:4002"])) is None
  # the client's own choice wins either way
  assert pd._direct(_FakeClient(["tcp://10.0.0.7:4002"], direct=True)) is True
  assert pd._direct(_FakeClient(["tcp://127.0.0.1:4001"], direct=False)) is False
  # no worker listed (a scheduler that did not answer in time): the scheduler's own address decides
  assert pd._direct(_FakeClient([], scheduler="tcp://127.0.0.1:8786")) is True
  assert pd._direct(_FakeClient([], scheduler="tcp://10.0.0.7:8786")) is None


def _on_scheduler(keys, dask_scheduler=None):
  return [k for k in keys if k in dask_scheduler.tasks]


def _run_tasks(dask_scheduler=None):
  tp = dask_scheduler.task_prefixes.get("_run")
  return sum(tp.state_counts.values()) if tp is not None else 0


def _count_proxied(dask_scheduler=None):
  """Counts, from now on, the messages the scheduler relays to workers (its `proxy` handler); returns the count."""
  if not hasattr(dask_scheduler, "_test_proxied"):
    dask_scheduler._test_proxied = 0
    inner = dask_scheduler.handlers["proxy"]

    async def counted(*args, **kwargs):
      dask_scheduler._test_proxied += 1
      return await inner(*args, **kwargs)
    dask_scheduler.handlers["proxy"] = counted
  return dask_scheduler._test_proxied


def test_calls_on_reachable_workers_go_to_their_actors_not_through_the_scheduler(client):
  # loopback workers are reachable: each call goes straight to the workers' actors (no task, no scheduler round
  # trip, no message relayed by the scheduler -- where a Dask Actor's method call goes by default), with the same
  # results as the sequential chunks
  dp, outs, ins = _dp(client, 16)
  assert dp.use_actors
  before = client.run_on_scheduler(_run_tasks)
  proxied = client.run_on_scheduler(_count_proxied)
  stats = client.run(pd.worker_stats)
  arrays = _data(64, seed=6)
  got = dp(*arrays)
  want = _sequential(pygrad.compile(outs, ins), arrays, 16, RED)
  for g, w in zip(got, want): assert np.array_equal(g, w)
  assert client.run_on_scheduler(_run_tasks) == before
  assert client.run_on_scheduler(_count_proxied) == proxied
  after = client.run(pd.worker_stats)
  assert sorted(after[w]["runs"] - stats[w]["runs"] for w in after) == [2, 2]  # 4 chunks, 2 on each worker
  assert dp._held == []  # nothing of the call stays on the cluster


def test_a_call_keeps_only_its_own_results_on_the_cluster(client):
  # as tasks (workers the client cannot reach itself): a call's futures are held until the next call's tasks are
  # out (their release would delay them), never longer
  dp, outs, ins = _dp(client, 16)
  dp.use_actors = False
  dp(*_data(32, seed=4))
  first = [f.key for f in dp._held]
  assert len(first) == 2 and client.run_on_scheduler(_on_scheduler, first) == first
  dp(*_data(32, seed=5))
  assert len(dp._held) == 2 and not set(first) & {f.key for f in dp._held}
  deadline = time.monotonic() + 10
  while client.run_on_scheduler(_on_scheduler, first) and time.monotonic() < deadline: time.sleep(0.05)
  assert client.run_on_scheduler(_on_scheduler, first) == []  # the first call's results are gone from the cluster


def test_an_error_of_the_program_on_a_worker_is_raised_on_the_client(client):
  # a bad shared input reaches the workers' programs: their clear error comes back as itself, not as a lost worker
  dp, outs, ins = _dp(client, 16)
  arrays = _data(32, seed=7)
  with pytest.raises(ValueError, match="w1"):
    dp(arrays[0], arrays[1], arrays[2][:4], arrays[3])
  got = dp(*arrays)  # the cluster is still usable
  want = _sequential(pygrad.compile(outs, ins), arrays, 16, RED)
  for g, w in zip(got, want): assert np.array_equal(g, w)


def test_a_worker_keeps_a_bounded_number_of_programs(client):
  # a long-lived worker that is sent graph after graph keeps the most recently used ones, not all of them
  old = client.run(pd._set_programs_limit, 3)
  try:
    dps = []
    for k in range(5):
      outs, ins = _mlp(8, dh=17 + k)  # five distinct graphs
      dp = pd.DataParallel(outs, ins, client, batch=[ins[0], ins[1]], reduce=dict(enumerate(RED)))
      dp(*_data(16, dh=17 + k, seed=k))
      dps.append(dp)
    assert all(s["programs"] <= 3 for s in client.run(pd.worker_stats).values())
    # the first graph left the worker's cache; its DataParallel still runs it (its actors hold their program)
    arrays = _data(16, dh=17, seed=9)
    got = dps[0](*arrays)
    want = _sequential(pygrad.compile(*_mlp(8, dh=17)), arrays, 8, RED)
    for g, w in zip(got, want): assert np.array_equal(g, w)
    dps[0].use_actors = False  # as tasks, the workers compile it again
    before = sum(s["compiles"] for s in client.run(pd.worker_stats).values())
    got = dps[0](*arrays)
    for g, w in zip(got, want): assert np.array_equal(g, w)
    assert sum(s["compiles"] for s in client.run(pd.worker_stats).values()) > before
  finally:
    for w, n in old.items(): client.run(pd._set_programs_limit, n, workers=[w])


def test_a_worker_that_joins_later_gets_chunks_too():
  # a cluster scaled up after the DataParallel's first call: the new worker gets an actor, and its share of chunks
  old = os.environ.get("PYGRAD_NUM_THREADS")
  os.environ["PYGRAD_NUM_THREADS"] = "1"
  try:
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=None, silence_logs=50) as cluster, \
         distributed.Client(cluster) as c:
      c.wait_for_workers(1, timeout=120)
      dp, outs, ins = _dp(c, 16)
      arrays = _data(64, seed=8)
      want = _sequential(pygrad.compile(outs, ins), arrays, 16, RED)
      for g, w in zip(dp(*arrays), want): assert np.array_equal(g, w)
      cluster.scale(2)
      c.wait_for_workers(2, timeout=120)
      dp._actors_checked = 0.0  # as if _ACTOR_RECHECK seconds had passed
      before = c.run(pd.worker_stats)
      for g, w in zip(dp(*arrays), want): assert np.array_equal(g, w)
      after = c.run(pd.worker_stats)
      assert len(after) == 2 and all(after[w]["runs"] - before.get(w, {"runs": 0})["runs"] == 2 for w in after)
  finally:
    if old is None: os.environ.pop("PYGRAD_NUM_THREADS", None)
    else: os.environ["PYGRAD_NUM_THREADS"] = old


def test_the_graph_is_sent_again_when_the_cluster_lost_it(client):
  # Dask's memory manager keeps one replica of data no task waits for; if its worker dies the graph is gone from the
  # cluster: the next call sends it again (it used to hang on tasks the scheduler had cancelled)
  dp, outs, ins = _dp(client, 16)
  arrays = _data(32, seed=10)
  want = _sequential(pygrad.compile(outs, ins), arrays, 16, RED)
  dp.use_actors = False
  for g, w in zip(dp(*arrays), want): assert np.array_equal(g, w)
  old = dp._blob
  client.cancel([old], force=True)  # what the scheduler does to data that went with its last worker
  deadline = time.monotonic() + 10
  while old.status == "finished" and time.monotonic() < deadline: time.sleep(0.05)
  for g, w in zip(dp(*arrays), want): assert np.array_equal(g, w)
  assert dp._blob is not old


def _shared_runs(client):
  return sum(v["shared_runs"] for v in client.run(pd.worker_stats).values())


def _calls_match(dp, prog, seeds, dims):
  """dp's call on a batch of 256 made from each seed equals the sequential chunks' results bit for bit."""
  for seed in seeds:
    arrays = _data(256, seed=seed, **dims)
    for g, w in zip(dp(*arrays), _sequential(prog, arrays, 64, RED)): assert np.array_equal(g, w)


def test_workers_on_this_machine_read_the_arrays_from_shared_memory(client):
  # loopback workers map the client's shared memory: a call's arrays of 4 KiB or more are not sent over the
  # socket (smaller ones still are); results are the sequential chunks' bit for bit, call after call (each call
  # rewrites the segment), and the same with shared_memory=False, when everything goes by socket
  dims = dict(din=32, dh=64, dout=8)  # x chunks and w1 8 KiB (shared memory), y chunks and w2 2 KiB (socket)
  outs, ins = _mlp(64, **dims)
  prog = pygrad.compile(outs, ins)
  dp = pd.DataParallel(outs, ins, client, batch=ins[:2], reduce=dict(enumerate(RED)))
  before = _shared_runs(client)
  _calls_match(dp, prog, (8, 9), dims)
  assert _shared_runs(client) == before + 8
  dp.shared_memory = False
  _calls_match(dp, prog, (10,), dims)
  assert _shared_runs(client) == before + 8


def _refuse_shared_memory(refuse: bool):
  from pygrad import shared_arrays as sa
  if refuse:
    sa._attach_saved = sa._attach

    def refused(name):
      raise sa.NoSharedMemory(f"test: {name} refused")
    sa._attach = refused
  else:
    sa._attach = sa._attach_saved


def test_workers_that_cannot_map_shared_memory_get_the_arrays_by_socket(client):
  # a worker whose /dev/shm is not the client's (another container on the same network): the call still completes,
  # its arrays sent again by socket, and later calls send them by socket from the start
  dims = dict(din=32, dh=64, dout=8)
  outs, ins = _mlp(64, **dims)
  prog = pygrad.compile(outs, ins)
  client.run(_refuse_shared_memory, True)
  try:
    dp = pd.DataParallel(outs, ins, client, batch=ins[:2], reduce=dict(enumerate(RED)))
    before = _shared_runs(client)
    _calls_match(dp, prog, (11, 12), dims)
    assert _shared_runs(client) == before and not dp._shm_workers
  finally:
    client.run(_refuse_shared_memory, False)
