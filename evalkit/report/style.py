"""How a scheme is shown, in one place: its label, the footnote its label points to, its colour and line.

The table (:mod:`.tables`), every figure (:mod:`.plots`) and the notebooks take these from a
:class:`SchemeStyle` built for the whole store, so a label means the same thing everywhere and a
figure can never contradict its table:

* **Labels.** The baseline (``auto``: nothing quantized) reads ``baseline (<dtype>)``, the dtype the
  model really ran in. A static scheme drops its ``+scales=PATH`` (hundreds of characters) for a
  number, ``fp8_e4m3/head/static[1]``, and footnote ``[1]`` names the file. Numbers go to the
  store's scale files in sorted path order, so they do not depend on which rows a view shows.
* **Colours.** One hue per element format (a colour map: FP8 E4M3 blue, E5M2 orange, FP4 green,
  ...); each scheme of a format gets its own shade of that hue, so no two schemes share a colour.
  The line says where the scales come from (solid: dynamic, dashed: unit 1.0, dotted: static) and
  the marker the granularity (o tensor, s head, D block, v token, ^ group), as :meth:`SchemeStyle.legend_title`
  tells the reader. The baseline is black.

* **Marks.** The table marks a row ``†`` (hypothetical: no engine runs it), ``‡`` (columns its
  protocol does not measure) and ``≈n`` (the data do not order it against the other rows of number n:
  paired Δppl intervals); :meth:`SchemeStyle.with_marks` gives a style the marks of a table
  (:func:`evalkit.report.marks.styled` computes them), and its labels and notes then carry them too.

A style is built from scheme strings only (:meth:`SchemeStyle.of_store`, :meth:`SchemeStyle.of_frame`),
and marks come already decided: nothing here reads numbers, so styling never changes what a table or
figure reports.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from evalkit.evals.figures import (  # noqa: F401 (the figure kit lives with the evaluations' figures; re-exported)
    METRIC_LABELS,
    PERCENT_METRICS,
    add_footnote,
    metric_label,
    metric_scale,
    wrap,
)
from evalkit.kv.scheme import GranularityKind, ScaleSource, Scheme, parse_scheme

FAMILY_MAPS = ("Blues", "Oranges", "Greens", "Purples", "Reds", "YlOrBr", "PuRd", "Greys")
FAMILY_ORDER = ("fp8_e4m3", "fp8_e5m2", "fp4_e2m1", "int8", "int4", "fp8_e4m3fnuz", "int8_asym", "int4_asym")
LINESTYLES = {ScaleSource.DYNAMIC: "-", ScaleSource.UNIT: "--", ScaleSource.STATIC: ":"}
MARKERS = {
    GranularityKind.TENSOR: "o",
    GranularityKind.HEAD: "s",
    GranularityKind.BLOCK: "D",
    GranularityKind.TOKEN: "v",
    GranularityKind.GROUP: "^",
}
BASELINE_COLOR = "black"
LINE_NAMES = {ScaleSource.DYNAMIC: "— dynamic", ScaleSource.UNIT: "-- unit 1.0", ScaleSource.STATIC: "··· static"}
MARKER_NAMES = {
    GranularityKind.TENSOR: "o tensor",
    GranularityKind.HEAD: "□ head",
    GranularityKind.BLOCK: "◇ block",
    GranularityKind.TOKEN: "▽ token",
    GranularityKind.GROUP: "△ group",
}
SHADES = (0.42, 0.92)  # the part of each sequential map used: light enough to tell apart, dark enough to see


@dataclass(frozen=True)
class Line:
    """One series' look: what ``ax.plot(..., **line.kw())`` takes."""

    label: str
    color: tuple | str
    linestyle: str
    marker: str

    def kw(self) -> dict:
        return {"label": self.label, "color": self.color, "linestyle": self.linestyle, "marker": self.marker}


def family(scheme: Scheme) -> str:
    """The colour family of a scheme: its element format (nvfp4 and mxfp4 are both ``fp4_e2m1``)."""
    return "baseline" if scheme.is_identity else scheme.format


def _member_key(scheme: Scheme) -> tuple:
    kinds = list(GranularityKind)
    sources = list(ScaleSource)
    return (kinds.index(scheme.granularity.kind), scheme.granularity.size, sources.index(scheme.scales), str(scheme))


class SchemeStyle:
    """Labels, footnotes, colours and lines for a set of schemes (a store's)."""

    def __init__(
        self,
        schemes: Iterable[str],
        dtypes: Mapping[str, str] | None = None,
        marks: Mapping[tuple[str, str], str] | None = None,
        mark_notes: Mapping[str, str] | None = None,
    ):
        self.schemes = list(dict.fromkeys(str(s) for s in schemes))
        self.dtypes = dict(dtypes or {})
        self.marks = dict(marks or {})  # (model, canonical scheme) -> " † ≈1": what the table's row carries
        self.mark_notes = dict(mark_notes or {})  # mark symbol ("†", "‡", "≈") -> the note explaining it
        parsed = {s: parse_scheme(s) for s in self.schemes}
        self._parsed = parsed
        paths = sorted({p.static_path for p in parsed.values() if p.static_path})
        self.files = {path: n for n, path in enumerate(paths, 1)}
        members: dict[str, list[Scheme]] = {}
        for p in parsed.values():
            if not p.is_identity:
                members.setdefault(family(p), []).append(p)
        self.families = [f for f in FAMILY_ORDER if f in members] + sorted(set(members) - set(FAMILY_ORDER))
        self._members = members
        self._colors: dict[str, tuple] | None = None  # filled on first use: tables need no matplotlib

    def _palette(self) -> dict[str, tuple]:
        if self._colors is None:
            import matplotlib

            self._colors = {}
            lo, hi = SHADES
            for i, fam in enumerate(self.families):
                cmap = matplotlib.colormaps[FAMILY_MAPS[i % len(FAMILY_MAPS)]]
                group = sorted(dict.fromkeys(self._members[fam]), key=_member_key)
                for k, p in enumerate(group):
                    shade = (lo + hi) / 2 if len(group) == 1 else hi - (hi - lo) * k / (len(group) - 1)
                    self._colors[str(p)] = tuple(float(c) for c in cmap(shade))
                self._colors[f"family:{fam}"] = tuple(float(c) for c in cmap(0.7))
        return self._colors

    # -- building ---------------------------------------------------------------------------------
    @classmethod
    def of_store(cls, results) -> SchemeStyle:
        """The style of every scheme a loaded store (:class:`evalkit.report.results.Results`) holds."""
        schemes = sorted(set(results.rows["scheme"]), key=_order_key)
        dtypes = dict(results.dtypes)
        return cls(schemes, dtypes)

    @classmethod
    def of_frame(cls, frame) -> SchemeStyle:
        """The style of a summary frame: the store's schemes when the frame records them
        (:func:`evalkit.report.tables.summary_frame` does), else the frame's own."""
        schemes = list(frame.attrs.get("store_schemes", ())) + list(frame["scheme"])
        dtypes = {}
        if "dtype" in frame:
            dtypes = {m: d for m, d in zip(frame["model"], frame["dtype"]) if isinstance(d, str) and d}
        return cls(sorted(set(schemes), key=_order_key), dtypes)

    def with_marks(self, marks: Mapping[tuple[str, str], str], mark_notes: Mapping[str, str]) -> SchemeStyle:
        """This style with a table's marks: (model, scheme) -> marks, and symbol -> its note."""
        return SchemeStyle(self.schemes, self.dtypes, marks, mark_notes)

    # -- text -------------------------------------------------------------------------------------
    def scheme(self, text: str) -> Scheme:
        return self._parsed.get(text) or parse_scheme(text)

    def label(self, text: str, model: str | None = None, dtype: str | None = None) -> str:
        """The short label of a scheme string (see the module docstring), with its marks in ``model``'s table
        when the style carries them."""
        return self._short(text, model, dtype) + self._mark(text, model)

    def _mark(self, text: str, model: str | None) -> str:
        key = str(self.scheme(text))
        if model is not None or not self.marks:
            return self.marks.get((model, key), "")
        return next((m for (_, s), m in self.marks.items() if s == key), "")  # no model named: the first model's

    def _short(self, text: str, model: str | None, dtype: str | None) -> str:
        scheme = self.scheme(text)
        if scheme.is_identity:
            dtype = dtype or self.dtypes.get(model or "")
            return f"baseline ({dtype})" if isinstance(dtype, str) and dtype else "baseline"
        if scheme.static_path:
            n = self.files.get(scheme.static_path)
            if n is None:  # a scheme outside the set the style was built for: numbered after it
                n = self.files[scheme.static_path] = len(self.files) + 1
            short = str(scheme).replace(f"+scales={scheme.static_path}", "")
            head, _, options = short.partition("+")
            return f"{head}[{n}]" + (f"+{options}" if options else "")
        return str(scheme)

    def notes(self, schemes: Iterable[str] | None = None, model: str | None = None) -> list[str]:
        """The footnotes for the numbered labels among ``schemes`` (all the style's by default), then the
        notes of the marks their labels carry (in ``model``'s table; any model's when None)."""
        schemes = list(self.schemes if schemes is None else schemes)
        used = {self.scheme(s).static_path for s in schemes}
        out = [
            f"[{n}] static scales from {path}"
            for path, n in sorted(self.files.items(), key=lambda kv: kv[1])
            if path in used
        ]
        keys = {str(self.scheme(s)) for s in schemes}
        shown = "".join(m for (m_, s), m in self.marks.items() if s in keys and (model is None or m_ == model))
        return out + [note for symbol, note in self.mark_notes.items() if symbol in shown]

    # -- colour and line --------------------------------------------------------------------------
    def color(self, text: str):
        scheme = self.scheme(text)
        if scheme.is_identity:
            return BASELINE_COLOR
        palette = self._palette()
        if str(scheme) not in palette:
            raise KeyError(f"{text} is not one of the schemes this style was built for")
        return palette[str(scheme)]

    def family_color(self, fam: str):
        return BASELINE_COLOR if fam == "baseline" else self._palette()[f"family:{fam}"]

    def family_label(self, fam: str) -> str:
        """A format family as a legend names it: ``fp4_e2m1 (nvfp4, mxfp4)`` when its schemes are named ones."""
        named = list(dict.fromkeys(p.name for p in sorted(self._members.get(fam, []), key=_member_key) if p.name))
        return f"{fam} ({', '.join(named)})" if named else fam

    def legend_title(self, schemes: Iterable[str], lines: bool = True) -> str:
        """What the line styles and markers of ``schemes`` mean (only those drawn), for a legend's title."""
        parsed = [self.scheme(s) for s in schemes if not self.scheme(s).is_identity]
        kinds = [k for k in GranularityKind if any(p.granularity.kind is k for p in parsed)]
        out = []
        if lines:
            sources = [k for k in ScaleSource if any(p.scales is k for p in parsed)]
            out.append("line: scales (" + ", ".join(LINE_NAMES[k] for k in sources) + ")")
        out.append("marker: granularity (" + ", ".join(MARKER_NAMES[k] for k in kinds) + ")")
        return "\n".join(out)

    def line(self, text: str, model: str | None = None) -> Line:
        scheme = self.scheme(text)
        return Line(
            self.label(text, model),
            self.color(text),
            LINESTYLES[scheme.scales],
            MARKERS.get(scheme.granularity.kind, "o"),
        )


def _order_key(text: str) -> tuple:
    """Baseline first, then by format family, granularity and scale source."""
    scheme = parse_scheme(text)
    fam = family(scheme)
    rank = FAMILY_ORDER.index(fam) if fam in FAMILY_ORDER else len(FAMILY_ORDER)
    return (not scheme.is_identity, rank, fam, _member_key(scheme))
