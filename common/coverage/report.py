"""The report: ``OpCoverage`` (one op), ``Coverage`` (one quantizer on one graph), and the
tables of several (``side_by_side``, ``spec_table``), in either language."""

from collections import Counter
from dataclasses import dataclass, field, replace

from common.charts import display_width, pad
from common.coverage.ops import MOVING_KINDS
from common.coverage.words import (
    _ALIKE,
    _HEADERS,
    _LIST,
    _STATUS_ZH_TW,
    _checked,
    _spec_in,
    _Text,
)
from common.lesson import lesson_language

_ROLES = ("activation", "weight")


@dataclass(frozen=True)
class OpCoverage:
    """One compute op of the graph, as the quantizer left it.

    Attributes:
        node: the node's name in the exported graph (``conv2d_3``).
        op: the aten op (``conv2d``, ``linear``, ``add_``, ``scaled_dot_product_attention``).
        kind: ``conv``, ``linear``, ``matmul``, ``attention``, ``add`` or ``mul``; with
            ``every_op=True`` also a kind of ``OPS`` (``activation``, ``pool``, ``norm``, ...).
        module: the innermost module the node was recorded in (``blocks.0.se``; ``""``: the model).
        module_type: that module's class name.
        int8: whether every input the op computes on is quantized (or fused into the int8
            op before it).
        mode: ``static``, ``dynamic``, ``fused`` (it runs inside the int8 conv or linear
            before it: a ReLU, a GELU, x86's add) or ``shared`` (int8 in and out with its
            input's qparams: max-pool, cat) for an int8 op; ``""`` for a float one.
        reason: for a float op, why, read from the annotations, the graph and the
            quantizer's rules; for an int8 op, the specs of its inputs.
        specs: ``(role, spec)`` for each input the op computes on and the quantizer
            quantized: role ``activation`` or ``weight`` (a conv's or linear's second
            input), spec as in ``reason`` (``s8 per-channel symmetric``).
        said: ``reason`` as its template and values, from which ``reason_in`` says it in
            either language; None for an op built by hand (``reason_in`` then gives
            ``reason``).
    """

    node: str
    op: str
    kind: str
    module: str
    module_type: str
    int8: bool
    mode: str
    reason: str
    specs: tuple = ()
    said: _Text | None = field(default=None, compare=False, repr=False)

    @property
    def status(self) -> str:
        """``int8 static``, ``int8 dynamic``, ``int8 fused``, ``int8 shared`` or ``float``."""
        return f"int8 {self.mode}" if self.int8 else "float"

    def status_in(self, lang: str) -> str:
        """``status`` in ``lang``, ``"en"`` or ``"zh_TW"`` (``int8 融合``, ``浮點數``)."""
        if _checked(lang) == "en":
            return self.status
        return _STATUS_ZH_TW.get(self.mode, f"int8 {self.mode}") if self.int8 else "浮點數"

    @property
    def why(self) -> str:
        """``reason`` in the language of the lesson that asks (``lesson_language()``): what a
        page prints, while ``reason`` stays the English that asserts compare."""
        return self.reason_in(lesson_language())

    def reason_in(self, lang: str) -> str:
        """``reason`` in ``lang``, ``"en"`` (``reason`` itself) or ``"zh_TW"``.

        >>> said = _text("int8 fused", specs=("u8 per-tensor affine",), nodes=("conv2d",))
        >>> op = OpCoverage("add", "add", "add", "", "", True, "fused", "", said=said)
        >>> op.reason_in("zh_TW")
        'u8 per-tensor 仿射（與 conv2d 融合）'
        """
        lang = _checked(lang)
        if self.said is None or lang == "en":
            return self.reason
        return self.said.render(lang)


@dataclass(frozen=True)
class Coverage:
    """The report of ``coverage``: one ``OpCoverage`` per compute op, in graph order.

    Attributes:
        label: the quantizer's name in tables (``X86InductorQuantizer``, ``... dynamic``).
        ops: the compute ops (every op of ``OPS`` when ``every_op``).
        said: ``label`` as its template and values, when ``coverage`` made it (a zh_TW
            table says ``X86InductorQuantizer（動態）``); None for a label given by hand.
        every_op: whether ``coverage`` was asked for every op (``every_op=True``); the
            summary then says "ops", not "compute ops".
        nothing_quantized: None when ``prepare_pt2e`` put an observer in the graph; else why
            nothing was quantized (a ``forward`` under ``@torch.no_grad()``, or no annotation
            at all), which ``summary``, ``table`` and ``grouped`` say on their first line.
    """

    label: str
    ops: tuple
    said: _Text | None = field(default=None, compare=False, repr=False)
    every_op: bool = field(default=False, compare=False)
    nothing_quantized: _Text | None = field(default=None, compare=False, repr=False)

    def _label_in(self, lang: str) -> str:
        return self.said.render(lang) if self.said is not None else self.label

    def _alarm(self, lang: str) -> list[str]:
        """The line that says nothing was quantized, and why, above what a report prints."""
        if self.nothing_quantized is None:
            return []
        between = "：" if lang == "zh_TW" else ": "
        return [f"{self._label_in(lang)}{between}{self.nothing_quantized.render(lang)}"]

    def __getitem__(self, node: str) -> OpCoverage:
        for op in self.ops:
            if op.node == node:
                return op
        what = "op" if self.every_op else "compute op"
        raise KeyError(f"no {what} named {node!r} (one of: {', '.join(self.names())})")

    def names(
        self, *, kind: str | None = None, int8: bool | None = None, op: str | None = None
    ) -> list[str]:
        """The nodes' names, optionally only one ``kind``, only int8 (True) or float (False),
        only one aten ``op`` (``layer_norm``)."""
        return [
            o.node
            for o in self.ops
            if (kind is None or o.kind == kind)
            and (int8 is None or o.int8 == int8)
            and (op is None or o.op == op)
        ]

    def statuses(self, op: str) -> Counter:
        """How many nodes of the aten ``op`` (``max_pool2d``) got each status."""
        return Counter(o.status for o in self.ops if o.op == op)

    def counts(self) -> dict[str, tuple[int, int]]:
        """kind to (int8 ops, all ops), kinds in the order the graph first uses them."""
        found: dict[str, list[int]] = {}
        for op in self.ops:
            entry = found.setdefault(op.kind, [0, 0])
            entry[0] += op.int8
            entry[1] += 1
        return {kind: (int8, total) for kind, (int8, total) in found.items()}

    def schemes(self, role: str) -> list[str]:
        """The distinct specs the quantizer gave the ``activation`` or ``weight`` inputs, sorted.

        Raises:
            ValueError: if ``role`` is neither.
        """
        if role not in _ROLES:
            raise ValueError(f"role={role!r}: use one of {', '.join(map(repr, _ROLES))}")
        return sorted({spec for op in self.ops for r, spec in op.specs if r == role})

    def reasons(self) -> Counter:
        """How many float ops each reason accounts for."""
        return Counter(op.reason for op in self.ops if not op.int8)

    def summary(self, *, lang: str | None = None) -> str:
        """Int8 ops out of all, per kind; then each float reason with its count, a line each
        (reasons that differ only in the nodes they name share a line, the nodes merged).
        When nothing was quantized, a line that says so, and why, comes first.

        Args:
            lang: ``"en"`` or ``"zh_TW"``; the running lesson's (``lesson_language()``) when
                omitted.
        """
        lang = _checked(lang)
        int8 = sum(op.int8 for op in self.ops)
        kinds = _kinds(self, lang)
        groups: dict[tuple, list[OpCoverage]] = {}
        for op in self.ops:
            if not op.int8:
                groups.setdefault(_reason_key(op), []).append(op)
        ordered = sorted(groups.values(), key=len, reverse=True)  # stable: first seen first
        said = [(len(members), _merged_reason(members, lang)) for members in ordered]
        label, count = self._label_in(lang), len(self.ops)
        if lang == "zh_TW":
            what = "運算" if self.every_op else "計算運算"
            kinds = f"（{kinds}）" if kinds else ""
            lines = [f"{label}：{count} 個{what}中有 {int8} 個是 int8{kinds}"]
            lines += [f"  浮點數 ×{n}：{reason}" for n, reason in said]
        else:
            what = "ops" if self.every_op else "compute ops"
            kinds = f" ({kinds})" if kinds else ""
            lines = [f"{label}: {int8} of {count} {what} int8{kinds}"]
            lines += [f"  float ×{n}: {reason}" for n, reason in said]
        return "\n".join([*self._alarm(lang), *lines])

    def _only(self, only: str | None, with_layout: bool = True) -> list[OpCoverage]:
        kinds = {op.kind for op in self.ops}
        ops = [op for op in self.ops if with_layout or op.kind not in MOVING_KINDS]
        if only in (None, "float", "int8"):
            return [op for op in ops if only is None or op.int8 == (only == "int8")]
        if only in kinds:
            return [op for op in ops if op.kind == only]
        raise ValueError(
            f"only={only!r}: use 'float', 'int8', a kind of this report "
            f"({', '.join(sorted(kinds))}) or leave it out"
        )

    def table(self, *, only: str | None = None, lang: str | None = None) -> str:
        """A plain-text table: node, op, module, status, reason; under the line that says
        nothing was quantized, when nothing was.

        Args:
            only: ``"float"`` or ``"int8"`` to list those ops only, or a kind (``"norm"``);
                all of them when omitted.
            lang: ``"en"`` or ``"zh_TW"``; the running lesson's (``lesson_language()``) when
                omitted.

        Raises:
            ValueError: if ``only`` is another value.
        """
        chosen = self._only(only)
        lang = _checked(lang)
        words = _HEADERS[lang]
        rows = [
            (op.node, op.op, op.module or words["model"], op.status_in(lang), op.reason_in(lang))
            for op in chosen
        ]
        header = (words["node"], words["op"], words["module"], self._label_in(lang), words["why"])
        return "\n".join([*self._alarm(lang), _format([header], rows)])

    def grouped(
        self, *, only: str | None = None, with_layout: bool = True, lang: str | None = None
    ) -> str:
        """A short table: one row per op, status and reason, with its count, ops of a kind
        together (kinds in the order the graph first uses them). Node names in a reason are
        merged (the first three, then ``…``). ``only`` as in ``table``; ``with_layout=False``
        leaves out the ops that only move values (kinds ``layout`` and ``slice``:
        ``MOVING_KINDS``). No row: the header alone. When nothing was quantized, the line
        that says so, and why, comes first.

        >>> from common.pt2e import export_module, x86_quantizer
        >>> net = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4), nn.ReLU())
        >>> gm = export_module(net, (torch.ones(2, 4),))
        >>> report = coverage(gm, x86_quantizer(), every_op=True)
        >>> report.grouped(only="activation", lang="en").splitlines()[1].split("  ")[-1]
        'runs as a post-op inside the int8 linear kernel of linear, linear_1'
        """
        chosen = self._only(only, with_layout)
        lang = _checked(lang)
        kinds = list(dict.fromkeys(op.kind for op in self.ops))
        groups: dict[tuple, list[OpCoverage]] = {}
        for op in sorted(chosen, key=lambda o: kinds.index(o.kind)):
            said = op.said
            key = (op.kind, op.op, op.status, said.key if said else op.reason)
            groups.setdefault(key, []).append(op)
        rows = []
        for members in groups.values():
            first = members[0]
            rows.append(
                (
                    first.kind,
                    first.op,
                    str(len(members)),
                    first.status_in(lang),
                    _merged_reason(members, lang),
                )
            )
        words = _HEADERS[lang]
        header = (words["kind"], words["op"], "n", self._label_in(lang), words["why"])
        return "\n".join([*self._alarm(lang), _format([header], rows)])


#: The fields of a reason that name nodes: ``grouped`` merges them across a group's members.
_NODE_FIELDS = ("nodes", "root", "producer", "dropout", "extra")


def _reason_key(op: OpCoverage) -> tuple:
    """An op's reason without the nodes it names: the ops ``summary`` counts on one line."""
    if op.said is None:
        return (op.reason,)
    return (op.said.key, *((k, v) for k, v in op.said.values if k not in _NODE_FIELDS))


def _merged_reason(members: list[OpCoverage], lang: str) -> str:
    """The reason of a group of ops: its node fields list every member's nodes (at most 3);
    when the members' other values differ (a broadcast mul's shapes), the first member's,
    said so."""
    said = members[0].said
    if said is None:
        return members[0].reason_in(lang)
    values = dict(said.values)
    others = {tuple((k, v) for k, v in m.said.values if k not in _NODE_FIELDS) for m in members}
    alike = _ALIKE[lang] if len(others) > 1 else ""
    for name in _NODE_FIELDS:
        if name not in values:
            continue
        seen = []
        for member in members:
            value = dict(member.said.values)[name]
            for node in value if isinstance(value, tuple) else (value,):
                if node not in seen:
                    seen.append(node)
        shown = _LIST[lang].join(seen[:3]) + ("…" if len(seen) > 3 else "")
        values[name] = (shown,) if name == "nodes" else shown
    return replace(said, values=tuple(values.items())).render(lang) + alike


def _kinds(report: Coverage, lang: str) -> str:
    """``conv 3/3, add 1/1``: int8 ops out of all, per kind, listed in the language's way."""
    return _LIST[lang].join(f"{kind} {i}/{n}" for kind, (i, n) in report.counts().items())


def _format(header: list[tuple], rows: list[tuple]) -> str:
    table = header + rows
    widths = [max(display_width(str(row[i])) for row in table) for i in range(len(table[0]))]
    lines = []
    for row in table:
        cells = [pad(str(cell), width) for cell, width in zip(row[:-1], widths, strict=False)]
        lines.append("  ".join([*cells, str(row[-1])]).rstrip())
    return "\n".join(lines)


def side_by_side(*reports: Coverage, lang: str | None = None) -> str:
    """One table, a status column per report: the same graph under several quantizers.

    Args:
        reports: ``coverage`` reports of one exported graph.
        lang: ``"en"`` or ``"zh_TW"``; the running lesson's (``lesson_language()``) when
            omitted.

    Returns:
        str: node, op, module, then each report's status (``int8 static``, ``float``, ...);
        above it, for each report that quantized nothing, the line that says so.

    Raises:
        ValueError: if no report is given or they cover different nodes (other graphs).
    """
    if not reports:
        raise ValueError("side_by_side needs at least one report: side_by_side(x86, xnnpack)")
    names = [op.node for op in reports[0].ops]
    for report in reports[1:]:
        if [op.node for op in report.ops] != names:
            raise ValueError(
                f"{report.label!r} covers other nodes than {reports[0].label!r}: "
                "give side_by_side reports of the same exported graph"
            )
    lang = _checked(lang)
    words = _HEADERS[lang]
    rows = [
        (op.node, op.op, op.module or words["model"], *(r.ops[i].status_in(lang) for r in reports))
        for i, op in enumerate(reports[0].ops)
    ]
    labels = (r._label_in(lang) for r in reports)
    table = _format([(words["node"], words["op"], words["module"], *labels)], rows)
    return "\n".join([*(line for r in reports for line in r._alarm(lang)), table])


def spec_table(*reports: Coverage, lang: str | None = None) -> str:
    """One row per quantizer: the specs of its activations and weights, its int8 ops per kind.

    Args:
        reports: ``coverage`` reports, of one graph or several.
        lang: ``"en"`` or ``"zh_TW"``; the running lesson's (``lesson_language()``) when
            omitted.

    Returns:
        str: quantizer, activations, weights, int8 ops (``conv 3/3, add 1/1, ...``); a
        quantizer that gave one role several specs lists them separated by ``/``; above it,
        for each report that quantized nothing, the line that says so.

    Raises:
        ValueError: if no report is given.
    """
    if not reports:
        raise ValueError("spec_table needs at least one report: spec_table(x86, xnnpack)")
    lang = _checked(lang)
    between = " / " if lang == "en" else "／"
    rows = []
    for report in reports:
        activations, weights = (
            between.join(_spec_in(spec, lang) for spec in report.schemes(r)) or "-" for r in _ROLES
        )
        rows.append((report._label_in(lang), activations, weights, _kinds(report, lang)))
    if lang == "zh_TW":
        table = _format([("quantizer", "活化值", "weight", "int8 運算")], rows)
    else:
        table = _format([("quantizer", "activations", "weights", "int8 ops")], rows)
    return "\n".join([*(line for r in reports for line in r._alarm(lang)), table])
