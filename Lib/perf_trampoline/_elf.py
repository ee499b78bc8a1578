"""The lowest layer: the dynamic symbols of an ELF image, read in bounded
pieces, from a file (dynamic_symbol) or from where the image is loaded in
a process's memory (loaded_symbol).

RemoteError, the error of every request that cannot be made, lives here
because ELFError is one; the layers above raise it too.
"""

import os
import stat
import struct

# Bounds on what is read of an ELF file the target maps.
ELF_MAX_SECTIONS = 1 << 16
ELF_MAX_TABLE = 64 << 20


class RemoteError(Exception):
    """The request cannot be made; the target was not changed."""


class ELFError(RemoteError):
    """An image the target maps is not an ELF file we can read."""


# ----------------------------------------------------------------------
# The dynamic symbol table of an image, read in bounded pieces

def _read_exact(fd, size, offset, file_size, what):
    if offset < 0 or size < 0 or offset + size > file_size:
        raise ELFError(f"{what}: beyond the end of the file")
    data = os.pread(fd, size, offset)
    if len(data) != size:
        raise ELFError(f"short read of {what}")
    return data


def dynamic_symbol(fd, name):
    """(value, ELF file type) of the dynamic symbol `name` (bytes) in the
    64-bit little-endian ELF file open as `fd`, or None if it has no such
    symbol.  Raises ELFError if `fd` is not a regular file or not an ELF
    file this reads: only the headers, the section headers, .dynsym and
    its string table are read, each checked against the file's size."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise ELFError("not a regular file")
    size = st.st_size
    header = _read_exact(fd, 64, 0, size, "the ELF header")
    if header[:4] != b"\x7fELF":
        raise ELFError("not an ELF file")
    if header[4] != 2 or header[5] != 1:
        raise ELFError("not a 64-bit little-endian ELF file")
    e_type, = struct.unpack_from("<H", header, 16)
    shoff, = struct.unpack_from("<Q", header, 40)
    shentsize, shnum = struct.unpack_from("<HH", header, 58)
    if shoff == 0:
        return None                     # no section headers: no .dynsym
    if shentsize != 64:
        raise ELFError(f"section header size {shentsize}, not 64")
    if shnum == 0:
        # More sections than e_shnum holds: section 0's sh_size has it.
        first = _read_exact(fd, 64, shoff, size, "section header 0")
        shnum, = struct.unpack_from("<Q", first, 32)
    if shnum > ELF_MAX_SECTIONS:
        raise ELFError(f"{shnum} sections")
    table = _read_exact(fd, shnum * 64, shoff, size, "the section headers")
    sections = list(struct.iter_unpack("<IIQQQQIIQQ", table))
    SHT_STRTAB = 3
    SHT_DYNSYM = 11
    for _, sh_type, _, _, offset, length, link, _, _, entsize in sections:
        if sh_type != SHT_DYNSYM:
            continue
        if entsize != 24 or length % 24:
            raise ELFError(".dynsym has entries that are not 24 bytes")
        if link >= shnum or sections[link][1] != SHT_STRTAB:
            raise ELFError(".dynsym has no string table")
        str_offset, str_length = sections[link][4], sections[link][5]
        if length > ELF_MAX_TABLE or str_length > ELF_MAX_TABLE:
            raise ELFError("the dynamic symbol table is too large")
        symbols = _read_exact(fd, length, offset, size, ".dynsym")
        strings = _read_exact(fd, str_length, str_offset, size, ".dynstr")
        # Names may share tails ("x_name" holds "name"): every place the
        # name ends a string is a possible st_name.
        wanted = name + b"\0"
        places = set()
        at = strings.find(wanted)
        while at >= 0:
            places.add(at)
            at = strings.find(wanted, at + 1)
        if not places:
            return None
        SHN_UNDEF = 0
        for (st_name, _, _, shndx, value,
             _) in struct.iter_unpack("<IBBHQQ", symbols):
            if st_name in places and shndx != SHN_UNDEF and value:
                return value, e_type
        return None
    return None


def _gnu_hash(name):
    h = 5381
    for c in name:
        h = (h * 33 + c) & 0xffffffff
    return h


def load_bias(e_type, base):
    """What the addresses in an image of ELF file type `e_type` whose first
    page is loaded at `base` are offset by: a shared object's or a PIE's
    (ET_DYN) are offsets from where it is loaded, an executable not linked
    position-independent (ET_EXEC) is loaded at its own."""
    ET_DYN = 3
    return base if e_type == ET_DYN else 0


def loaded_symbol(read, base, name):
    """Address of the dynamic symbol `name` (bytes) in the shared object
    or executable whose first page is loaded at `base`, found in memory
    through `read(address, size)`, or None.  For a tool without
    CAP_SYS_ADMIN, which may not open /proc/PID/map_files: the loaded
    image's program headers, dynamic section and GNU hash table, each
    read bounded, instead of the file's section headers."""
    def fetch(address, size, what):
        if size > ELF_MAX_TABLE:
            raise ELFError(f"{what} is too large")
        data = read(address, size)
        if len(data) != size:
            raise ELFError(f"{what} is not mapped")
        return data

    header = fetch(base, 64, "the ELF header")
    if header[:4] != b"\x7fELF" or header[4] != 2 or header[5] != 1:
        raise ELFError("not a 64-bit little-endian ELF image")
    e_type, = struct.unpack_from("<H", header, 16)
    bias = load_bias(e_type, base)
    phoff, = struct.unpack_from("<Q", header, 32)
    phentsize, phnum = struct.unpack_from("<HH", header, 54)
    if phentsize != 56:
        raise ELFError(f"program header size {phentsize}, not 56")
    PT_DYNAMIC = 2
    table = fetch(base + phoff, phnum * 56, "the program headers")
    for p_type, _, _, p_vaddr, _, _, p_memsz, _ in struct.iter_unpack(
            "<IIQQQQQQ", table):
        if p_type == PT_DYNAMIC:
            break
    else:
        return None
    dynamic = {}
    for tag, value in struct.iter_unpack(
            "<qQ", fetch(bias + p_vaddr, p_memsz - p_memsz % 16,
                         "the dynamic section")):
        if tag == 0:            # DT_NULL
            break
        dynamic.setdefault(tag, value)
    DT_STRTAB, DT_SYMTAB, DT_STRSZ, DT_GNU_HASH = 5, 6, 10, 0x6ffffef5
    if any(tag not in dynamic
           for tag in (DT_STRTAB, DT_SYMTAB, DT_STRSZ, DT_GNU_HASH)):
        return None
    # The dynamic loader may have relocated the addresses in place.
    strtab, symtab, gnu = (value + bias if value < bias else value
                           for value in (dynamic[DT_STRTAB],
                                         dynamic[DT_SYMTAB],
                                         dynamic[DT_GNU_HASH]))
    strsz = dynamic[DT_STRSZ]
    nbuckets, symoffset, bloom_size, _ = struct.unpack(
        "<IIII", fetch(gnu, 16, "the GNU hash table"))
    if nbuckets == 0:
        return None
    buckets = gnu + 16 + bloom_size * 8
    chains = buckets + nbuckets * 4
    h = _gnu_hash(name)
    index, = struct.unpack("<I", fetch(buckets + h % nbuckets * 4, 4,
                                       "a hash bucket"))
    if index < symoffset:
        return None
    for _ in range(ELF_MAX_TABLE // 24):
        chain, = struct.unpack("<I", fetch(chains + (index - symoffset) * 4,
                                           4, "a hash chain"))
        if chain | 1 == h | 1:
            st_name, _, _, shndx, value, _ = struct.unpack(
                "<IBBHQQ", fetch(symtab + index * 24, 24, "a symbol"))
            if st_name + len(name) < strsz and shndx != 0 and value:
                if fetch(strtab + st_name, len(name) + 1,
                         "a symbol name") == name + b"\0":
                    return value + bias
        if chain & 1:
            return None
        index += 1
    raise ELFError("a hash chain without end")
