"""Bootstrap that runs INSIDE the sandbox, before the untrusted program (threat model: sandbox.py).

It is passed to the interpreter as ``python -I -c <this file's text> <json config>`` (no file of
ours needs to be readable by the sandbox user). The process tree it builds::

    supervisor  (root, in the trainer's pid namespace)  enters new namespaces, read-only mounts,
     |                                                   private tmpfs; writes report.json
     +- init    (pid 1 of a new pid namespace)          reaps; when the program's main process
         |                                               ends, init exits and the kernel kills
         +- program  (per-run uid)                       everything left in the namespace
                     limits, privilege drop, socket guard, then the program

Without a pid namespace (refused by the kernel, or ``namespaces="off"``) the supervisor is a
child subreaper (prctl PR_SET_CHILD_SUBREAPER: orphans of the program, setsid or not, are
re-parented to it), forks the program directly and, once the program's main process ended,
SIGKILLs every descendant it finds in /proc until it has no child left. A trainer that is not
root and got no private file system confines the program with Landlock instead (``_landlock``).

The supervisor answers SIGTERM (the parent's time limit) by SIGKILLing init (or the program's
main process), then tears down as above; the program cannot signal it (another uid, and
outside its pid namespace). Modes: ``stdin`` executes the program as ``__main__``; ``call``
executes it as a module, calls ``fn_name`` (a top-level function or a method of ``Solution()``)
with the JSON arguments and writes ``<nonce><json result>`` on a private duplicate of stdout.

Standard library only; keep it small: everything here runs for every test case.
"""

import ctypes
import json
import os
import resource
import signal
import struct
import sys

cfg = json.loads(sys.argv[1])
_libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWUSER = 0x00020000, 0x08000000, 0x10000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
_MOUNT_FLAGS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": 1024, "relatime": 1 << 21}
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 36, 38
# Landlock (uapi/linux/landlock.h): syscalls, write accesses of files (WRITE_FILE, REMOVE_DIR,
# REMOVE_FILE, MAKE_CHAR/DIR/REG/SOCK/FIFO/BLOCK/SYM; REFER from ABI 2, TRUNCATE from ABI 3),
# TCP bind and connect (ABI 4), scopes of abstract unix sockets and signals (ABI 6)
SYS_LL_CREATE, SYS_LL_ADD_RULE, SYS_LL_RESTRICT = 444, 445, 446
LL_FS_WRITE, LL_REFER, LL_TRUNCATE, LL_WRITE_FILE = 0x1FF2, 1 << 13, 1 << 14, 1 << 1


def _check(ret, what):
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _write(path, text):
    with open(path, "w") as f:
        f.write(text)


def _unshare():
    """Enter new mount, pid, network and IPC namespaces (a user namespace too when not root);
    only a network namespace when those are refused; returns the names entered."""
    if cfg["namespaces"] == "off":
        return []
    uid, gid = os.getuid(), os.getgid()
    user = CLONE_NEWUSER if uid != 0 else 0
    full = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | user
    for flags, names in ((full, ["mount", "pid", "net", "ipc"]), (CLONE_NEWNET | user, ["net"])):
        if _libc.unshare(flags) == 0:
            if user:  # become root of the new user namespace, mapped to our own uid outside
                _write("/proc/self/setgroups", "deny")
                _write("/proc/self/uid_map", f"0 {uid} 1")
                _write("/proc/self/gid_map", f"0 {gid} 1")
                names = [*names, "user"]
            return names
    return []


def _mounts():
    """Mount points of this mount namespace, innermost last (from /proc/self/mountinfo)."""
    import codecs

    with open("/proc/self/mountinfo", "rb") as f:
        return [(codecs.escape_decode(line.split()[4])[0], line.split()[5].decode()) for line in f]


def _read_only(mounts):
    """Make ``mounts`` read-only: the program's only writable file system is then its private
    tmpfs. MS_BIND makes it a flag of this namespace's copy of each mount, never of the host's."""
    for target, options in reversed(mounts):
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY
        for opt in options.split(","):
            flags |= _MOUNT_FLAGS.get(opt, 0)
        _libc.mount(None, target, None, flags, None)  # best effort: a refusal leaves that mount as it was


def _private_fs(uid, gid):
    """One tmpfs capped in bytes and inodes, its subdirectories bound over every world-writable
    directory (the parent lists them, the one holding our control directory last), everything
    else read-only; returns the program's working directory in it, or None when the tmpfs cannot
    be mounted (then no mount was changed)."""
    _check(_libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "make / private")
    mounts = _mounts()
    root = os.path.join(cfg["control"], "fs")
    opts = f"size={cfg['scratch_bytes']},nr_inodes={cfg['max_files']},mode=0755".encode()
    if _libc.mount(b"tmpfs", root.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, opts) != 0:
        return None
    _read_only(mounts)
    binds = []
    for target in cfg["shared_dirs"]:
        sub = os.path.join(root, target.strip("/").replace("/", "_"))
        os.mkdir(sub)
        os.chmod(sub, 0o1777)
        binds.append((sub, target))
    work = os.path.join(root, "tmp", "work")
    os.mkdir(work, 0o700)
    if uid is not None:
        os.chown(work, uid, gid)
    for sub, target in binds:
        _check(_libc.mount(sub.encode(), target.encode(), None, MS_BIND, None), f"bind {target}")
    return "/tmp/work"


def _init(program_status_w):
    """pid 1 of the new pid namespace: fork the program, reap every orphan, report the program's
    wait status and exit (the kernel then SIGKILLs what is left and waits for it)."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    _libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)  # best effort
    program = os.fork()
    if program == 0:
        os.close(program_status_w)
        return
    while True:
        pid, status = os.waitpid(-1, 0)
        if pid == program:
            os.write(program_status_w, str(status).encode())
            os._exit(0)


def _descendants():
    children = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(name))
    found, todo = [], [os.getpid()]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def _kill_descendants():
    """Fallback teardown of a subreaper: SIGKILL all descendants and reap until no child is left."""
    import time

    while True:
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            return
        for pid in _descendants():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.001)


def _start(names, report_fd):
    """Fork the program (under init with a pid namespace); returns (main pid, status pipe or
    None) in the supervisor and (None, None) in the program's process."""
    if "pid" in names:
        r, w = os.pipe()
        main = os.fork()
        if main == 0:
            os.close(r)
            os.close(report_fd)
            try:
                _init(w)
            except BaseException:  # noqa: BLE001 - init failed: no status, the parent reports an error
                os._exit(1)
            return None, None
        os.close(w)
        return main, r
    _check(_libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "PR_SET_CHILD_SUBREAPER")
    main = os.fork()
    if main == 0:
        os.close(report_fd)
        return None, None
    return main, None


def _wait(main, status_r):
    """The program's exit code (negative: killed by that signal), or None if it was killed
    on the parent's request; every process it started is gone when this returns."""
    signal.signal(signal.SIGTERM, _killer(main))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    while True:  # as a subreaper, orphans arrive here too
        pid, status = os.waitpid(-1, 0)
        if pid == main:
            break
    if status_r is not None:  # init's exit killed the namespace; it passed on the program's status
        data = os.read(status_r, 32)
        status = int(data) if data else None
    else:
        _kill_descendants()
    return None if status is None else os.waitstatus_to_exitcode(status)


def _supervise():
    """Returns (working directory, namespaces, program source) only in the program's process;
    every other process of the tree ends here with ``os._exit``."""
    report = {"returncode": None, "namespaces": [], "private_fs": False, "landlock": 0, "fatal": None}
    report_fd = os.open(os.path.join(cfg["control"], "report.json"), os.O_WRONLY | os.O_TRUNC)
    try:
        with open(os.path.join(cfg["control"], "main.py"), "rb") as f:  # before /tmp is covered
            source = f.read()
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        names = report["namespaces"] = _unshare()
        work = _private_fs(cfg["uid"], cfg["gid"]) if "mount" in names else None
        report["private_fs"] = work is not None
        if cfg["uid"] is None and work is None:  # no uid of its own, no private files: Landlock
            report["landlock"] = _LANDLOCK[0] = _landlock_abi()
        if cfg["namespaces"] == "require" and not ("pid" in names and work):
            raise OSError(ctypes.get_errno(), "the kernel refused new mount/pid/network namespaces or a tmpfs")
        work = work or os.path.join(cfg["control"], "work")
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # until the handler is in place
        main, status_r = _start(names, report_fd)
        if main is None:
            return work, names, source
        report["returncode"] = _wait(main, status_r)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises
        report["fatal"] = f"{type(exc).__name__}: {exc}"
    os.write(report_fd, json.dumps(report).encode())
    os._exit(0)


def _killer(pid):
    """A SIGTERM handler that SIGKILLs our child ``pid``, through a pidfd when the kernel has them
    (so a late signal can never hit a recycled pid)."""
    try:
        fd = os.pidfd_open(pid)
        send, target = signal.pidfd_send_signal, fd
    except (AttributeError, OSError):
        send, target = os.kill, pid

    def handler(*_):
        try:
            send(target, signal.SIGKILL)
        except ProcessLookupError:
            pass

    return handler


def _enter_program(work, names, source):
    """In the program's process, still root: its file, limits, then the privilege drop."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    os.chdir(work)
    with open("main.py", "wb") as f:
        f.write(source)
    os.chmod("main.py", 0o644)
    os.environ.update(HOME=work, TMPDIR="/tmp" if work == "/tmp/work" else work)
    for name, value in cfg["limits"].items():
        resource.setrlimit(getattr(resource, name), tuple(value) if isinstance(value, list) else (value, value))
    if cfg["uid"] is not None:
        os.setgroups([])
        os.setgid(cfg["gid"])
        os.setuid(cfg["uid"])
    elif "user" in names:  # root of our own user namespace: a nested one has no power over our mounts
        _check(_libc.unshare(CLONE_NEWUSER), "nested user namespace")
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", "0 0 1")
        _write("/proc/self/gid_map", "0 0 1")
    if cfg["uid"] is None:  # RLIMIT_NPROC counts per user namespace and uid: the nested one is the run's
        nproc = cfg["max_processes"] + (0 if "user" in names else _threads_of(os.getuid()))
        hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
        nproc = nproc if hard == resource.RLIM_INFINITY else min(nproc, hard)
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "PR_SET_NO_NEW_PRIVS")
    if _LANDLOCK[0]:
        _landlock(work, _LANDLOCK[0])
    return os.path.join(work, "main.py"), source


def _threads_of(uid):
    """Processes and threads whose real uid is ``uid`` (what RLIMIT_NPROC counts without namespaces)."""
    n = 0
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
            n += int(fields["Threads"]) if int(fields["Uid"].split()[0]) == uid else 0
        except (OSError, KeyError, ValueError):
            continue
    return n


_LANDLOCK = [0]  # the ABI the supervisor found, for the program's process (0: not used)


def _syscall(*args):
    return _libc.syscall(*(ctypes.c_long(a) if isinstance(a, int) else a for a in args))


def _landlock_abi():
    return max(_syscall(SYS_LL_CREATE, None, 0, 1), 0)  # LANDLOCK_CREATE_RULESET_VERSION


def _landlock(work, abi):
    """Confine this process and its descendants (Landlock, unprivileged): files may be created,
    written, removed only under ``work`` and /dev/shm (POSIX semaphores: the parent sweeps what is
    left there), and /dev/null written; from ABI 4 no TCP bind or connect; from ABI 6 no signal
    to, and no abstract unix socket of, a process outside this run."""
    fs = LL_FS_WRITE | (LL_REFER if abi >= 2 else 0) | (LL_TRUNCATE if abi >= 3 else 0)
    attr = struct.pack("=QQQ", fs, 3, 3)[: 8 if abi < 4 else 16 if abi < 6 else 24]
    ruleset = _syscall(SYS_LL_CREATE, ctypes.create_string_buffer(attr, len(attr)), len(attr), 0)
    if ruleset < 0:
        _check(-1, "landlock_create_ruleset")
    shm = [("/dev/shm", fs)] if os.path.isdir("/dev/shm") else []
    for path, access in ((work, fs), *shm, ("/dev/null", fs & (LL_WRITE_FILE | LL_TRUNCATE))):
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        rule = struct.pack("=Qi", access, fd)
        _check(_syscall(SYS_LL_ADD_RULE, ruleset, 1, ctypes.create_string_buffer(rule, len(rule)), 0), "landlock rule")
        os.close(fd)
    _check(_syscall(SYS_LL_RESTRICT, ruleset, 0), "landlock_restrict_self")
    os.close(ruleset)


_path, _source = _enter_program(*_supervise())

if cfg.get("socket_guard", True):
    import socket

    def _no_network(*_args, **_kwargs):
        raise OSError(101, "network is disabled in the trustbench sandbox")

    for _attr in ("socket", "create_connection", "create_server", "socketpair", "fromfd", "getaddrinfo"):
        setattr(socket, _attr, _no_network)
    sys.modules.pop("_socket", None)
    sys.modules["_socket"] = None  # a later `import _socket` fails

_result_fd = os.dup(1) if cfg["mode"] == "call" else None
_code = compile(_source, _path, "exec")

if cfg["mode"] == "stdin":
    import types

    _main = types.ModuleType("__main__")
    _main.__file__ = _path
    sys.modules["__main__"] = _main  # the program's functions pickle by reference (multiprocessing)
    exec(_code, _main.__dict__)
    sys.stdout.flush()
else:
    _globals = {"__name__": "solution", "__file__": _path, "__builtins__": __builtins__}
    exec(_code, _globals)
    _fn = _globals.get(cfg["fn_name"])
    if _fn is None and "Solution" in _globals:
        _fn = getattr(_globals["Solution"](), cfg["fn_name"], None)
    if _fn is None:
        raise NameError(f"the program defines no function or Solution method {cfg['fn_name']!r}")
    _value = _fn(*cfg["args"])
    if isinstance(_value, tuple):
        _value = list(_value)
    try:
        _text = json.dumps(_value)
    except (TypeError, ValueError):
        _text = json.dumps(repr(_value))
    sys.stdout.flush()
    os.write(_result_fd, ("\n" + cfg["nonce"] + _text + "\n").encode())
