"""The stack oracle's workloads (test_oracle).

Run as a script, in the interpreter being profiled:

    ORACLE_OUT=DIR python [-X perf | -X perf_jit] oracle.py SHAPE [SHAPE ...]

Each shape calls leaf functions in its own way (threads, generators,
forked children, pool workers, ...).  A leaf first records its true
Python stack, the code objects' qualified names from sys._getframe() up
to the outermost frame, then spins for SPIN seconds of CPU time and
appends one JSON line to DIR/<pid>.jsonl:

    {"shape": ..., "pid": ..., "tid": ..., "start": ns, "end": ns,
     "chain": [leaf, caller, ..., "<module>"]}

with start and end read from CLOCK_MONOTONIC, the clock of "perf record
-k 1".  Every sample perf takes in that thread between start and end was
taken in the leaf, and its Python frames must be exactly the chain.

Only the standard library is used, but for the gunicorn shape's Debian
gunicorn: test_oracle runs it on Debian's python3.11 with perftramp311
too.  Environment: ORACLE_SPIN (seconds
per leaf, default 0.2), ORACLE_ENABLE ("NAME=VALUE", the variable that
switches trampolines on in a child started with a command line of its
own), ORACLE_BACKEND (what the activation shape passes to
sys.activate_stack_trampoline), ORACLE_STOP (1: each leaf calls
os.getppid() once it has its chain, where a debugger stops and walks the
stack: test_unwind), ORACLE_SITE (a directory to import gunicorn from).
"""

import asyncio
import ctypes
import functools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import traceback
from time import (
    CLOCK_MONOTONIC, clock_gettime_ns, monotonic, sleep, thread_time_ns)

SPIN = float(os.environ.get("ORACLE_SPIN", "0.2"))
STOP = os.getppid if os.environ.get("ORACLE_STOP") == "1" else None

# Frames that were running when the trampolines were switched on
# (activation shape): they never went through one, so perf cannot name
# them.  The frame objects are kept so that their ids stay theirs.
_before_activation = {}


def true_chain(frame):
    """Qualified names from `frame` outwards, leaving out the frames
    that were running before an activation."""
    names = []
    while frame is not None:
        if id(frame) not in _before_activation:
            names.append(frame.f_code.co_qualname)
        frame = frame.f_back
    return names


def record(chain, start, end):
    line = json.dumps({"shape": os.environ["ORACLE_SHAPE"],
                       "pid": os.getpid(), "tid": threading.get_native_id(),
                       "start": start, "end": end, "chain": chain})
    fd = os.open(os.path.join(os.environ["ORACLE_OUT"],
                              f"{os.getpid()}.jsonl"),
                 os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


# A leaf: records its stack, then spins for SPIN seconds of its thread's
# CPU time (whatever else the machine runs), calling only C functions:
# thread_time_ns() is a system call, so rarely (DWARF unwinding often
# fails from a sample taken in one).
LEAF_SOURCE = """\
def {name}():
    chain = true_chain(sys._getframe())
    if STOP:
        STOP()
    start = clock_gettime_ns(CLOCK_MONOTONIC)
    deadline = thread_time_ns() + int(SPIN * 1e9)
    x = 0
    while thread_time_ns() < deadline:
        for i in range(100_000):
            x += i
    record(chain, start, clock_gettime_ns(CLOCK_MONOTONIC))
    return x
"""


def define(source, name, **names):
    """Compile `source` (a def statement, seeing this module's globals and
    `names`) now, in this process: a new code object, first run wherever
    it is called from."""
    namespace = dict(globals(), **names)
    exec(compile(source, f"<oracle {name}>", "exec"), namespace)
    return namespace[name]


def new_leaf(name):
    return define(LEAF_SOURCE.format(name=name), name)


def python_command(*args):
    """This interpreter with its perf options, running this file."""
    return [sys.executable, *subprocess._args_from_interpreter_flags(),
            os.path.abspath(__file__), *args]


def switched_env(on):
    """os.environ with the trampolines' variable set, or removed."""
    name, _, value = os.environ["ORACLE_ENABLE"].partition("=")
    env = dict(os.environ)
    env.pop(name, None)
    if on:
        env[name] = value
    return env


def run_child(command, env=None):
    subprocess.run(command, check=True, env=env)


def forked(pid, function, *args):
    """Just after a fork: in the child (pid 0), call function(*args) and
    exit, with status 1 if it raised; in the parent, return pid."""
    if pid != 0:
        return pid
    status = 1
    try:
        function(*args)
        status = 0
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(status)


def reap(pid):
    _, status = os.waitpid(pid, 0)
    if status != 0:
        raise ChildProcessError(f"child {pid} ended with status {status}")


def started(targets):
    """A started thread running each of `targets`."""
    threads = [threading.Thread(target=target) for target in targets]
    for t in threads:
        t.start()
    return threads


# ----------------------------------------------------------------------
# Shapes, in one process

def shape_calls():
    leaf = new_leaf("calls_leaf")

    class Service:
        def handle(self):
            return helper()

        @staticmethod
        def static():
            return Service().handle()

    def helper():
        def inner():
            return leaf()
        return inner()

    Service.static()
    # A deep chain of distinct functions, each calling the next.
    deep = leaf
    for i in range(20):
        deep = define(f"def calls_d{i}():\n    return callee()\n",
                      f"calls_d{i}", callee=deep)
    deep()


def shape_exceptions():
    leaf = new_leaf("exceptions_leaf")

    def raiser(n):
        if n:
            return raiser(n - 1)
        raise ValueError(n)

    def in_handler():
        try:
            raiser(5)
        except ValueError:
            return leaf()

    def in_finally():
        try:
            raiser(3)
        finally:
            leaf()

    def after_unwinding():
        # Frames unwound by an exception are gone from the stack.
        for _ in range(3):
            try:
                raiser(10)
            except ValueError:
                pass
        return leaf()

    class Guard:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            leaf()
            return True

    def in_exit():
        with Guard():
            raiser(2)

    in_handler()
    try:
        in_finally()
    except ValueError:
        pass
    after_unwinding()
    in_exit()


def shape_generators():
    leaf = new_leaf("generators_leaf")

    def gen():
        yield 1
        leaf()
        yield 2

    def delegating():
        yield from gen()

    def consume():
        for _ in delegating():
            pass

    def first_caller(g):
        return next(g)

    def second_caller(g):
        return next(g)

    consume()
    # A generator resumed by another caller than the one that started it.
    g = gen()
    first_caller(g)
    second_caller(g)
    sum(leaf() for _ in range(1))
    s = gen()
    next(s)
    s.send(None)


def shape_coroutines():
    leaf = new_leaf("coroutines_leaf")

    async def inner():
        await asyncio.sleep(0)
        return leaf()

    async def outer():
        return await inner()

    async def agen():
        await asyncio.sleep(0)
        yield leaf()

    async def main():
        await outer()
        await asyncio.gather(outer(), outer())
        async for _ in agen():
            pass

    asyncio.run(main())

    async def plain():
        return leaf()

    def drive():
        coro = plain()
        try:
            coro.send(None)
        except StopIteration:
            pass

    drive()


def shape_threads():
    leaf = new_leaf("threads_leaf")

    def work():
        return leaf()

    for t in started([work, work]):
        t.join()
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda _: work(), range(2)))


def recursion(depth, leaf):
    """down0 -> down1 -> ... -> down6 -> down0 ... `depth` calls deep,
    then `leaf`: seven names, so that a frame missing anywhere shows."""
    source = "".join(f"def down{k}(n):\n"
                     f"    return down{(k + 1) % 7}(n - 1) if n else leaf()\n"
                     for k in range(7))
    return define(source, "down0", leaf=leaf)(depth)


def shape_recursion():
    recursion(500, new_leaf("recursion_leaf"))


def shape_recursion_thread():
    # Deeper than the C stack of a small thread allows frames that take
    # some: 3.11 runs Python-to-Python calls without it.
    leaf = new_leaf("recursion_thread_leaf")
    old_limit = sys.getrecursionlimit()
    old_size = threading.stack_size(256 * 1024)
    sys.setrecursionlimit(10_000)
    try:
        for t in started([functools.partial(recursion, 3000, leaf)]):
            t.join()
    finally:
        threading.stack_size(old_size)
        sys.setrecursionlimit(old_limit)


# ----------------------------------------------------------------------
# Shapes with children

CHILD_MAIN = """\
def child_main():
    return child_mid()
"""
CHILD_MID = """\
def child_mid():
    return leaf()
"""


def in_child(label, parent_defined):
    """Run in a new child: code the parent never ran (defined before the
    fork), then code defined only here."""
    parent_defined()
    leaf = new_leaf(f"{label}_child_leaf")
    mid = define(CHILD_MID, "child_mid", leaf=leaf)
    define(CHILD_MAIN, "child_main", child_mid=mid)()


def fork_shape(fork, label):
    """A leaf in the parent, then in a child made by `fork`."""
    leaf = new_leaf(f"{label}_leaf")
    leaf()

    def never_run_in_parent():
        return leaf()

    reap(forked(fork(), in_child, label, never_run_in_parent))


def shape_fork():
    fork_shape(os.fork, "fork")


def shape_fork_nocopy():
    # As -X perf_fork_copy=0, in this process: perf's DWARF unwinder
    # loses the frames of a process that a recorded one started with exec.
    persist = ctypes.pythonapi.PyUnstable_PerfTrampoline_SetPersistAfterFork
    persist(0)
    try:
        fork_shape(os.fork, "fork_nocopy")
    finally:
        persist(1)


def pool_work(_):
    """First run in a pool's worker."""
    leaf = new_leaf("pool_leaf")
    return leaf()


def pool_shape(method):
    import multiprocessing
    ctx = multiprocessing.get_context(method)
    with ctx.Pool(2) as pool:
        pool.map(pool_work, range(2), chunksize=1)


def shape_pool_fork():
    pool_shape("fork")


def shape_pool_forkserver():
    pool_shape("forkserver")


def shape_pool_spawn():
    pool_shape("spawn")


APP_SOURCE = """\
def handle(request, new_leaf):
    return respond(new_leaf)

def respond(new_leaf):
    return new_leaf("app_leaf")()
"""


def server_worker(master_end, conn, app_dir):
    # Like a pre-fork server's worker: the application is imported after
    # the fork, in each worker.
    master_end.close()
    sys.path.insert(0, app_dir)
    import oracle_app
    while True:
        request = conn.recv(64)
        if request in (b"", b"quit"):
            return
        oracle_app.handle(request, new_leaf)
        conn.sendall(b"done")


def shape_server():
    app_dir = os.path.join(os.environ["ORACLE_OUT"], "app")
    os.makedirs(app_dir, exist_ok=True)
    with open(os.path.join(app_dir, "oracle_app.py"), "w") as f:
        f.write(APP_SOURCE)

    def spawn_worker():
        master_end, worker_end = socket.socketpair()
        pid = forked(os.fork(), server_worker, master_end, worker_end,
                     app_dir)
        worker_end.close()
        return pid, master_end

    def serve(workers):
        for _, conn in workers:
            conn.sendall(b"request")
        for _, conn in workers:
            assert conn.recv(64) == b"done"

    def retire(worker):
        pid, conn = worker
        conn.sendall(b"quit")
        reap(pid)
        conn.close()

    workers = [spawn_worker() for _ in range(2)]
    serve(workers)
    # One worker retires and is replaced, as after max_requests.
    retire(workers.pop(0))
    workers.append(spawn_worker())
    serve(workers)
    for worker in workers:
        retire(worker)


def gunicorn_app(environ, start_response):
    """The gunicorn shape's WSGI application: each worker imports this
    file as a module of its own (oracle), after the fork."""
    new_leaf("gunicorn_leaf")()
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"%d" % os.getpid()]


def gunicorn_socket():
    return os.path.join(os.environ["ORACLE_OUT"], "gunicorn.sock")


def gunicorn_request():
    """GET / from the gunicorn shape's server, once it listens; the pid
    of the worker that answered."""
    deadline = monotonic() + 60
    while True:
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(gunicorn_socket())
                s.sendall(b"GET / HTTP/1.0\r\n\r\n")
                response = b"".join(iter(functools.partial(s.recv, 4096),
                                         b""))
            break
        except (FileNotFoundError, ConnectionRefusedError):
            if monotonic() > deadline:
                raise
            sleep(0.05)
    head, _, body = response.partition(b"\r\n\r\n")
    if head.split()[1:2] != [b"200"]:
        raise ConnectionError(f"gunicorn answered {response!r}")
    return int(body)


def gunicorn_client(served):
    """Request until three workers have answered, then stop the master
    (this process).  Each worker retires after two requests
    (--max-requests), so the fifth request at the latest is served by a
    worker the master forked while perf records."""
    try:
        while len(served) < 3:
            served.add(gunicorn_request())
    finally:
        os.kill(os.getpid(), signal.SIGTERM)


def shape_gunicorn():
    # gunicorn takes this process over (its signal handlers, its exit).
    if os.environ.get("ORACLE_SITE"):
        sys.path.append(os.environ["ORACLE_SITE"])
    from gunicorn.app.wsgiapp import run
    # Two sync workers (the default class), no --preload.
    sys.argv = ["gunicorn", "--workers=2", "--max-requests=2",
                "--log-level=warning", f"--bind=unix:{gunicorn_socket()}",
                f"--chdir={os.path.dirname(os.path.abspath(__file__))}",
                "oracle:gunicorn_app"]
    master = os.getpid()
    served = set()
    client, = started([functools.partial(gunicorn_client, served)])
    try:
        run()
    finally:
        # The master's end, not a worker's.
        if os.getpid() == master:
            client.join()
            if len(served) < 3:
                raise ChildProcessError(f"gunicorn's workers {served} "
                                        "served, then it stopped")


def libc_fork():
    # Through PyDLL: the GIL stays held, as in C code that forks.
    return ctypes.PyDLL(None).fork()


def shape_cfork():
    fork_shape(libc_fork, "cfork")


def exec_child():
    # Python code runs in the child before it execs.
    define("def before_exec():\n    return 1\n", "before_exec")()
    os.execv(sys.executable, python_command("exec_child"))


def shape_cfork_exec():
    reap(forked(libc_fork(), exec_child))


def shape_exec():
    run_child(python_command("exec_parent"))


def shape_exec_parent():
    new_leaf("exec_parent_leaf")()
    os.execv(sys.executable, python_command("exec_child"))


def shape_exec_child():
    new_leaf("exec_child_leaf")()


def shape_subprocess():
    run_child(python_command_plain("subprocess_child"), env=switched_env(True))


def python_command_plain(*args):
    """This interpreter without perf options, running this file."""
    return [sys.executable, os.path.abspath(__file__), *args]


def shape_subprocess_child():
    new_leaf("subprocess_child_leaf")()
    if os.environ.get("ORACLE_GRANDCHILD") != "1":
        run_child(python_command_plain("subprocess_child"),
                  env=dict(os.environ, ORACLE_GRANDCHILD="1"))


def shape_activation():
    # In a process of its own started without trampolines.
    run_child(python_command_plain("activation_child"),
              env=switched_env(False))


def shape_activation_child():
    leaf = new_leaf("activation_leaf")
    entered = threading.Semaphore(0)
    go = threading.Event()

    def work():
        return leaf()

    def early():
        entered.release()
        go.wait()
        return work()

    before = started([early, early])
    # Once in early(), a thread's frames below work() are there to stay.
    for t in before:
        entered.acquire()
    activate()
    go.set()
    after = started([work])
    work()
    for t in [*before, *after]:
        t.join()


def activate():
    # Every thread is blocked or here: nothing enters a frame meanwhile.
    for frame in sys._current_frames().values():
        while frame is not None:
            _before_activation[id(frame)] = frame
            frame = frame.f_back
    backend = os.environ["ORACLE_BACKEND"]
    if hasattr(sys, "activate_stack_trampoline"):
        sys.activate_stack_trampoline(backend)
    else:
        import perftramp311         # stock 3.11: the extension
        perftramp311.activate(backend)


SHAPES = {name[len("shape_"):]: function
          for name, function in globals().items()
          if name.startswith("shape_")}


def main(argv):
    # A shape whose thread raised has failed too.
    failed = []

    def excepthook(args):
        failed.append(args)
        threading.__excepthook__(args)

    threading.excepthook = excepthook
    # A process a shape started records under that shape's name.
    inherited = os.environ.get("ORACLE_SHAPE")
    for name in argv:
        os.environ["ORACLE_SHAPE"] = inherited or name
        SHAPES[name]()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
