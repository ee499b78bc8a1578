"""The directory record writes its files into, opened so that no one
else can send them elsewhere.

record runs as root on hosts where other users can write in /tmp, and
perhaps in the current directory.  A path is checked only at the moment
it is resolved: a link that another user plants in a directory they can
write in redirects everything written by that path later, and a check
that resolves links first (realpath()) checks where the link points, not
who planted it.  So the directory is opened once, from /, one component
at a time with O_NOFOLLOW (a link anywhere is refused, never followed),
each component checked on its own descriptor (-o /tmp/out):

    /      above the output: owned by root or us, and writable by no one
    tmp    else unless sticky (others may write in /tmp, not replace ours)
    out    the output: owned by root or us, writable by no one else

Writable by another user means by any means: the mode's bits for others,
or for a group that is not ours alone, or an entry of the directory's
POSIX ACL; its default ACL counts too, since what is made in the
directory inherits it.

A missing component is made with mkdirat() below the checked one, then
opened and checked like the others.  Every file is then created through
the last descriptor, O_NOFOLLOW and O_EXCL; programs that write by path
(perf and its scripts) run with /proc/self/fd/N, the directory itself, as
their working directory and are given names relative to it.
"""

import contextlib
import errno
import grp
import os
import pwd
import stat
import struct

__all__ = ["OutputDir", "UnsafeError"]

# O_PATH: a component needs only search permission, as in a path walk.
_DIR_FLAGS = (os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
_ADVICE = "choose a directory that only you can write in, e.g. -o ~/profiles"

# A POSIX ACL as the kernel keeps it in an extended attribute: a header
# (u32 version), then entries (u16 tag, u16 permissions, u32 id of a
# named user or group), little-endian.
_ACL_ACCESS = "system.posix_acl_access"
_ACL_DEFAULT = "system.posix_acl_default"     # inherited by new entries
_ACL_VERSION = 2
_ACL_HEADER = struct.Struct("<I")
_ACL_ENTRY = struct.Struct("<HHI")
ACL_USER_OBJ = 0x01     # the owner
ACL_USER = 0x02         # a named user
ACL_GROUP_OBJ = 0x04    # the owning group
ACL_GROUP = 0x08        # a named group
ACL_MASK = 0x10         # the most a named entry or the owning group gets
ACL_OTHER = 0x20
_ACL_WRITE = 0x02
_MASKED = (ACL_USER, ACL_GROUP_OBJ, ACL_GROUP)


class UnsafeError(Exception):
    """The directory is refused; the message says why and what to do."""


def _refuse(path, why):
    raise UnsafeError(f"{path} is not safe to write in: {why}; {_ADVICE}")


def _read_acl(fd, name):
    """The entries [(tag, permissions, id)] of the ACL `name` of the
    directory open as `fd`, or None if it has none.  An O_PATH
    descriptor has no xattr calls of its own: its /proc/self/fd link
    leads to the very directory, not to a path looked up again."""
    try:
        data = os.getxattr(f"/proc/self/fd/{fd}", name)
    except OSError as exc:
        # ENOTSUP: the file system keeps no ACLs.
        if exc.errno in (errno.ENODATA, errno.ENOTSUP):
            return None
        raise
    if (len(data) < _ACL_HEADER.size
            or (len(data) - _ACL_HEADER.size) % _ACL_ENTRY.size
            or _ACL_HEADER.unpack_from(data)[0] != _ACL_VERSION):
        raise OSError(errno.EINVAL, "not an ACL of version 2")
    return list(_ACL_ENTRY.iter_unpack(data[_ACL_HEADER.size:]))


def _ours_alone(gid):
    """Whether the group `gid` reaches no user but us.  A login takes a
    user's groups from the group and user databases: a group that bears
    our user name, lists no other member and is no other user's primary
    group (a user private group) is ours alone; any other group may have
    another member, now or once the databases change."""
    uid = os.geteuid()
    try:
        name = pwd.getpwuid(uid).pw_name
        group = grp.getgrgid(gid)
    except KeyError:
        return False
    return (group.gr_name == name
            and all(member == name for member in group.gr_mem)
            and all(user.pw_uid == uid for user in pwd.getpwall()
                    if user.pw_gid == gid))


def _named(database, kind, number):
    try:
        return f"{kind} {database(number)[0]} ({kind[0]}id {number})"
    except KeyError:
        return f"{kind} {number}"


def _other_writer(fd, st, here):
    """Who else than us or root may write in the directory `here` (open
    as `fd`, `st` its status), or in what is made in it, said in a few
    words ("others may write in ..."); None if no one."""
    for name in (_ACL_ACCESS, _ACL_DEFAULT):
        try:
            entries = _read_acl(fd, name)
        except OSError as exc:
            return f"the ACL of {here} cannot be read ({exc.strerror})"
        inherited = name == _ACL_DEFAULT
        if entries is None:
            if inherited:
                continue
            # Without an ACL, the mode's bits are the whole of it.
            entries = [(ACL_USER_OBJ, st.st_mode >> 6 & 7, 0),
                       (ACL_GROUP_OBJ, st.st_mode >> 3 & 7, 0),
                       (ACL_OTHER, st.st_mode & 7, 0)]
            how = ""
        else:
            how = " (its default ACL)" if inherited else " (its ACL)"
        mask = [perm for tag, perm, _ in entries if tag == ACL_MASK]
        # What is made in it has its group if it is set-group-ID, or ours.
        group = (os.getegid() if inherited and not st.st_mode & stat.S_ISGID
                 else st.st_gid)
        for tag, perm, number in entries:
            if tag in _MASKED and mask:
                perm &= mask[0]
            if not perm & _ACL_WRITE:
                continue
            if tag == ACL_OTHER:
                who = "others"
            elif tag == ACL_USER and number not in (os.geteuid(), 0):
                who = _named(pwd.getpwuid, "user", number)
            elif tag in (ACL_GROUP, ACL_GROUP_OBJ):
                number = number if tag == ACL_GROUP else group
                if _ours_alone(number):
                    continue
                who = _named(grp.getgrgid, "group", number)
            else:
                continue        # the owner (us or root), or us by name
            where = f"what is made in {here}" if inherited else here
            return f"{who} may write in {where}{how}"
    return None


def _check(fd, here, path, last):
    """Refuse the directory `here` (open as `fd`) on the way to `path`
    if another user owns it or could write in it, and so put a link or a
    directory of theirs in it.  A sticky directory above `path` (`last`
    false) keeps what is ours in it ours."""
    st = os.fstat(fd)
    if st.st_uid not in (os.geteuid(), 0):
        _refuse(path, f"{here} belongs to another user (uid {st.st_uid})")
    if not last and st.st_mode & stat.S_ISVTX:
        return
    writer = _other_writer(fd, st, here)
    if writer:
        _refuse(path, writer)


def _open_dir(parent, name, here, path):
    """The directory `name` in `parent`, not through a link."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent)
    except FileNotFoundError:
        raise
    except OSError as exc:
        # O_NOFOLLOW fails on a link (ELOOP or ENOTDIR): say which.
        try:
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except OSError:
            st = None
        if st is not None and stat.S_ISLNK(st.st_mode):
            _refuse(path, f"{here} is a symbolic link (record follows "
                          f"none)")
        exc.filename = here
        raise


class OutputDir:
    """An output directory, open: `path` is its name for messages, `fd`
    its descriptor, through which every file in it is made and read."""

    def __init__(self, path, fd):
        self.path = path
        self.fd = fd

    @classmethod
    def open(cls, path, mode=0o755):
        """Open the directory `path`, making it (and what is missing
        above it) with `mode`.  UnsafeError if a link is on the way, or
        another user owns or could write in it or a directory above it;
        OSError (its filename the component) if it cannot be opened or
        made.  Nothing is made until
        every component that exists has passed."""
        path = os.path.abspath(path)
        names = [name for name in path.split("/") if name]
        here = "/"
        fd = os.open(here, _DIR_FLAGS)
        try:
            _check(fd, here, path, not names)
            for i, name in enumerate(names):
                here = os.path.join(here, name)
                try:
                    child = _open_dir(fd, name, here, path)
                except FileNotFoundError:
                    try:
                        os.mkdir(name, mode, dir_fd=fd)
                    except FileExistsError:
                        pass    # made meanwhile: checked below all the same
                    except OSError as exc:
                        exc.filename = here
                        raise
                    child = _open_dir(fd, name, here, path)
                os.close(fd)
                fd = child
                _check(fd, here, path, i == len(names) - 1)
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd)

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def join(self, name):
        """The path of `name` in the directory, for messages."""
        return os.path.join(self.path, name)

    def as_cwd(self):
        """Popen arguments that run a program in this directory, whatever
        its path now leads to."""
        return {"cwd": f"/proc/self/fd/{self.fd}", "pass_fds": (self.fd,)}

    def lstat(self, name):
        return os.stat(name, dir_fd=self.fd, follow_symlinks=False)

    def exists(self, name):
        """Whether anything, a link too, is called `name` in it."""
        try:
            self.lstat(name)
        except FileNotFoundError:
            return False
        return True

    @contextlib.contextmanager
    def _naming(self, name):
        # An OSError names the file by its path, as an open() by path
        # would: the messages say where.
        try:
            yield
        except OSError as exc:
            exc.filename = self.join(name)
            raise

    def unlink(self, name):
        with self._naming(name):
            try:
                os.unlink(name, dir_fd=self.fd)
            except FileNotFoundError:
                pass

    def create(self, name, mode=0o644):
        """A new file `name`, open for writing (its descriptor): whatever
        had that name is removed first, never written through."""
        self.unlink(name)
        with self._naming(name):
            return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL
                           | os.O_NOFOLLOW | os.O_CLOEXEC, mode,
                           dir_fd=self.fd)

    def write_text(self, name, text):
        with self._naming(name), open(self.create(name), "w",
                                      encoding="utf-8") as f:
            f.write(text)

    def read_text(self, name):
        """The text of the regular file `name` (undecodable bytes
        replaced); OSError if it is missing or not a regular file."""
        with self._naming(name):
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
                         | os.O_CLOEXEC, dir_fd=self.fd)
            with open(fd, encoding="utf-8", errors="replace") as f:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise OSError(errno.EINVAL, "not a regular file")
                return f.read()
