"""PTX text -> one :class:`Entry` record per ``.entry``, each instruction with its line.

Parsing only splits and names things; what an instruction *means* lives in ``ops.py``.
Anything outside the subset (``.func``, ``.global`` variables, ``.local``, initialized
``.shared``, parameters that are not plain scalars) is refused here with its line, so a
module either loads completely or not at all.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field


class EmulatorError(Exception):
    """One emulator failure, rendered as one line.

    ``kind`` is one of: unsupported, divergence, out_of_bounds, misaligned,
    uninitialized, race, undefined, launch (a limit of the GPU, ptxas or the driver),
    budget (a launch that ran past its instruction budget), read_only (a store into a
    read-only numpy array). ``line``/``text`` name the
    PTX statement; ``ctaid``/``tid`` the first offending thread and ``address`` the byte
    address (global) or shared-window offset (shared), when they apply.
    """

    def __init__(self, kind: str, line: int | None, text: str, detail: str = "",
                 ctaid: tuple[int, int, int] | None = None,
                 tid: tuple[int, int, int] | None = None, address: int | None = None):
        self.kind, self.line, self.text, self.detail = kind, line, text, detail
        self.ctaid, self.tid, self.address = ctaid, tid, address
        parts = [f"ptxemu: {kind}"]
        if line is not None:
            parts.append(f"at line {line}")
        if text:
            parts.append(f"`{text}`")
        if ctaid is not None:
            parts.append(f"thread ctaid={fmt3(ctaid)} tid={fmt3(tid)}")
        if address is not None:
            parts.append(f"address={address:#x}")
        if detail:
            parts.append(f"({detail})")
        super().__init__(" ".join(parts))


def fmt3(xyz) -> str:
    return "(" + ",".join(str(int(v)) for v in xyz) + ")"


@dataclass(frozen=True)
class Instr:
    """One instruction statement: ``@!%p op.mods a, {b, c}, [d+4];``."""

    line: int
    text: str                 # normalized source text, for messages
    guard: tuple[str, bool] | None  # (predicate register, negated)
    op: str                   # full opcode with modifiers, e.g. "ld.global.v4.b32"
    args: tuple               # each a str, or a tuple of str for a {vector}


@dataclass
class Entry:
    """One kernel: its parameters, registers, shared symbols and decoded-ready body."""

    name: str
    line: int
    params: list[tuple[str, str]] = field(default_factory=list)      # (name, type)
    regs: dict[str, str] = field(default_factory=dict)                # name -> type
    shared: list[tuple[str, int, int | None, int]] = field(default_factory=list)
    # (symbol, align, bytes or None for .extern [], line)
    body: list[Instr] = field(default_factory=list)
    labels: dict[str, int] = field(default_factory=dict)              # label -> pc


# Directives that end at the newline (no ';' in PTX).
_LINE_DIRECTIVES = (".version", ".target", ".address_size", ".loc", ".file", ".section")
_HEADER = re.compile(r"(?:\.visible\s+|\.weak\s+)?\.entry\s+([\w$]+)\s*\((.*)\)(.*)", re.S)
_PARAM = re.compile(r"\.param\s+\.(u64|s64|b64|u32|s32|b32|u16|s16|b16|u8|s8|b8)\s+([\w$]+)")
_PERF = re.compile(r"\s*\.(maxntid|reqntid|minnctapersm|maxnctapersm|maxnreg|maxclusterrank"
                   r"|reqnctapercluster|explicitcluster|noreturn)\b[\d\s,]*")
_REG = re.compile(r"\.reg\s+\.(\w+)\s+(.+)")
_SHARED = re.compile(r"(\.extern\s+)?\.shared\s+(?:\.align\s+(\d+)\s+)?\.(\w+)\s+([\w$]+)"
                     r"\s*(?:\[\s*(\d*)\s*\])?")
_LABEL = re.compile(r"[A-Za-z_$%][\w$%]*")
_REG_TYPES = {"pred", "b8", "u8", "s8", "b16", "u16", "s16", "b32", "u32", "s32",
              "b64", "u64", "s64", "f16", "f32", "f64"}
_SIZES = {"b8": 1, "u8": 1, "s8": 1, "b16": 2, "u16": 2, "s16": 2, "b32": 4, "u32": 4,
          "s32": 4, "b64": 8, "u64": 8, "s64": 8}


def _strip_comments(text: str) -> str:
    """Blank out // and /* */ comments, keeping every newline so line numbers hold."""
    text = re.sub(r"/\*.*?\*/", lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def statements(text: str) -> list[tuple[int, str]]:
    """Split PTX into (line, statement) pairs; '{' and '}' of blocks are statements too."""
    out: list[tuple[int, str]] = []
    buf: list[str] = []
    line, start, depth = 1, 1, 0          # depth: inside an operand {vector}

    def flush():
        s = " ".join("".join(buf).split())
        if s:
            out.append((start, s))
        buf.clear()

    for ch in _strip_comments(text):
        if ch == "\n":
            line += 1
            if buf and "".join(buf).lstrip().startswith(_LINE_DIRECTIVES):
                flush()
            elif buf:
                buf.append(" ")
            continue
        if not buf:
            if ch in " \t\r":
                continue
            start = line
        if ch == ";" and depth == 0:
            flush()
        elif ch == "{":
            head = "".join(buf)
            if not head.strip() or ".entry" in head or ".func" in head:
                flush()
                out.append((line, "{"))
            else:
                depth += 1
                buf.append(ch)
        elif ch == "}":
            if depth:
                depth -= 1
                buf.append(ch)
            else:
                flush()
                out.append((line, "}"))
        elif ch == ":" and depth == 0 and _LABEL.fullmatch("".join(buf).strip()):
            out.append((start, "".join(buf).strip() + ":"))
            buf.clear()
        else:
            buf.append(ch)
    flush()
    return out


def split_args(s: str) -> tuple:
    """'a, {b, c}, [d+4]' -> ('a', ('b', 'c'), '[d+4]'), commas inside {} and [] kept."""
    args, cur, depth = [], [], 0
    for ch in s:
        if ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
        if ch == "," and depth == 0:
            args.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        args.append("".join(cur).strip())
    return tuple(tuple(x.strip() for x in a[1:-1].split(",")) if a.startswith("{") else a
                 for a in args)


def _expand_regs(spec: str) -> list[str]:
    names = []
    for part in spec.split(","):
        part = part.strip()
        m = re.fullmatch(r"([%\w$]+)<(\d+)>", part)
        names += [f"{m.group(1)}{i}" for i in range(int(m.group(2)))] if m else [part]
    return names


def _unsupported(line: int, text: str, why: str) -> EmulatorError:
    return EmulatorError("unsupported", line, text, why)


def _shared_decl(line: int, s: str) -> tuple[str, int, int | None, int]:
    m = _SHARED.fullmatch(s)
    if not m or m.group(3) not in _SIZES:
        raise _unsupported(line, s, "shared declaration form not supported "
                                    "(want `.shared .align A .b8 name[N]`)")
    ext, align, ty, name, count = m.groups()
    if ext and count:
        raise _unsupported(line, s, "extern shared must be declared `name[]`")
    nbytes = None if ext else _SIZES[ty] * (int(count) if count else 1)
    if not ext and count == "":
        raise _unsupported(line, s, "static shared array needs a size")
    return name, int(align or _SIZES[ty]), nbytes, line


def _instr(line: int, s: str) -> Instr:
    guard = None
    m = re.match(r"@(!?)([%\w$]+)\s+(.*)", s)
    if m:
        guard, s_body = (m.group(2), m.group(1) == "!"), m.group(3)
    else:
        s_body = s
    op, _, rest = s_body.partition(" ")
    return Instr(line, s + ";", guard, op, split_args(rest))


def parse(text: str) -> dict[str, Entry]:
    """Parse a PTX module into its entries (module-level .shared applies to every entry)."""
    entries: dict[str, Entry] = {}
    module_shared: list[tuple[str, int, int | None, int]] = []
    cur: Entry | None = None
    level = 0
    for line, s in statements(text):
        if s == "{":
            if cur is None:
                raise _unsupported(line, s, "block outside an .entry")
            level += 1
            continue
        if s == "}":
            level -= 1
            if level < 0:
                raise _unsupported(line, s, "unbalanced '}'")
            if level == 0:
                cur = None
            continue
        if cur is None or level == 0:
            if s.startswith((".version", ".target", ".loc", ".file")):
                continue
            if s.startswith(".address_size"):
                if s.split()[-1] != "64":
                    raise _unsupported(line, s, "only .address_size 64")
                continue
            if re.match(r"(\.extern\s+)?\.shared\b", s):
                module_shared.append(_shared_decl(line, s))
                continue
            m = _HEADER.fullmatch(s)
            if not m:
                raise _unsupported(line, s, "module-level statement outside the subset "
                                            "(only .version/.target/.address_size, "
                                            ".shared and .entry)")
            name, params, tail = m.groups()
            if _PERF.sub("", tail).strip():
                raise _unsupported(line, s, f"entry directive `{tail.strip()}`")
            cur = Entry(name, line, shared=list(module_shared))
            for p in filter(None, (p.strip() for p in params.split(","))):
                pm = _PARAM.fullmatch(p)
                if not pm:
                    raise _unsupported(line, p, "only scalar `.param .u64|.u32 name` "
                                                "parameters")
                cur.params.append((pm.group(2), pm.group(1)))
            entries[name] = cur
            continue
        # inside an entry body
        if s.endswith(":") and _LABEL.fullmatch(s[:-1]):
            cur.labels[s[:-1]] = len(cur.body)
        elif s.startswith(".reg"):
            m = _REG.fullmatch(s)
            if not m or m.group(1) not in _REG_TYPES:
                raise _unsupported(line, s, "register declaration type")
            for r in _expand_regs(m.group(2)):
                cur.regs[r] = m.group(1)
        elif re.match(r"(\.extern\s+)?\.shared\b", s):
            cur.shared.append(_shared_decl(line, s))
        elif s.startswith(".pragma"):
            continue
        elif s.startswith("."):
            raise _unsupported(line, s, "directive not supported inside an entry")
        else:
            cur.body.append(_instr(line, s))
    if level != 0:
        raise _unsupported(None, "", "unterminated entry body (missing '}')")
    return entries
