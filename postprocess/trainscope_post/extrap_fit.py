"""Fits single-parameter performance models with Extra-P (PyPI ``extrap``), run by the Python of
Extra-P's own environment: Extra-P pins numpy < 2 and trainscope-post's pandas needs numpy >= 2, so
scripts/setup installs Extra-P in a separate venv and trainscope_post.model runs this file there
(stdin: JSON request, stdout: JSON answer). This file imports nothing from trainscope_post.

Request: {"series": [{"name": str, "points": [p, ...], "values": [[repeat, ...], ...],
                      "scaling": "strong"|"weak"}], "evaluate": [p, ...]}
Answer:  {"extrap_version": str, "models": {name: {"function": str, "constant": float,
          "terms": [{"coefficient": float, "poly": float, "log": float}], "rss": float,
          "smape": float, "ar2": float, "search": str, "values": {p: value}}}}

The hypothesis space follows what the points can identify. Five or more distinct values of p:
Extra-P's default search (its PMNF building blocks, with negative exponents for strong scaling
but not its negative powers of log2 p, infinite at p = 1; terms chosen by leave-one-out
cross-validation). Three or four: the exponents -1, -1/2, 1/2, 1 (strong) or 1/2, 1 (weak) and
log2 p, still cross-validated. Two: one term with the exponent the scaling mode implies (strong:
c0 + c1 * p^-1, the work per rank; weak: c0 + c1 * log2 p, a collective's depth), fitted exactly.
One: a constant.
"""

import json
import math
import statistics
import sys
import warnings


def _modeler(n_points, scaling):
    from extrap.modelers.single_parameter.basic import SingleParameterModeler
    from extrap.entities.measurement import Measure
    m = SingleParameterModeler()
    m.use_measure = Measure.MEDIAN  # of the repeats: one disturbed repeat does not move the fit
    strong = scaling == "strong"
    if n_points >= 5:
        m.allow_negative_exponents = strong
        search = "extrap default PMNF search" + (" with negative exponents" if strong else "")
    elif n_points >= 3:
        m.poly_exponents = "-1,-0.5,0.5,1" if strong else "0.5,1"
        m.log_exponents = "1"
        search = "extrap PMNF search over p^{" + ("-1,-1/2,1/2,1" if strong else "1/2,1") + \
            "} x log2(p)^{0,1} (3-4 points)"
    else:
        m.force_combination_exponents = True
        m.poly_exponents = "-1" if strong else "0"
        m.log_exponents = "0" if strong else "1"
        m.use_crossvalidation = False
        search = "extrap fixed term " + ("c1 * p^-1" if strong else "c1 * log2(p)") + " (2 points)" \
            if n_points == 2 else "constant (1 point)"
    m._exponents_changed()
    # Extra-P's negative exponents include log2(p)^-1 and ^-2 (offered when no point is p = 1):
    # infinite at one rank, which is a valid target (advise at 1 GPU, leave-one-out of p = 1).
    m.hypotheses_building_blocks = [
        ct for ct in m.hypotheses_building_blocks
        if not any(t.term_type == "logarithm" and t.exponent < 0 for t in ct.simple_terms)]
    return m, search


def _term(t, p):
    return (p ** t["poly"]) * (math.log2(p) ** t["log"] if t["log"] else 1.0)


def _evaluate(constant, terms, p):
    return constant + sum(t["coefficient"] * _term(t, p) for t in terms)


def _format(constant, terms):
    out = f"{constant:.4g}"
    for t in terms:
        f = f"{t['coefficient']:.4g}"
        if t["poly"]:
            f += f" * p^({t['poly']:g})"
        if t["log"]:
            f += f" * log2(p)^({t['log']:g})"
        out += " + " + f
    return out


def _refit_without_constant(terms, points):
    """Least squares of the medians over the given terms, no constant (numpy of Extra-P's env)."""
    import numpy as np
    a = np.array([[_term(t, p) for t in terms] for p, _ in points])
    y = np.array([v for _, v in points])
    coef, *_ = np.linalg.lstsq(a, y, rcond=None)
    return [dict(t, coefficient=float(c)) for t, c in zip(terms, coef)]


def check(request):
    """Every series has as many value lists as points and only positive rank counts and finite
    values: Extra-P fits NaN into NaN models (or fails deep inside), so a bad series is named
    here instead. trainscope_post.model sends only finite times; this guards other callers."""
    for s in request.get("series", []):
        name = s.get("name", "?")
        if len(s["points"]) != len(s["values"]):
            raise ValueError(f"series {name!r}: {len(s['points'])} points but "
                             f"{len(s['values'])} value lists")
        if not all(isinstance(p, (int, float)) and math.isfinite(p) and p > 0
                   for p in s["points"]):
            raise ValueError(f"series {name!r}: points {s['points']!r} are not positive rank "
                             "counts")
        for p, vals in zip(s["points"], s["values"]):
            if not vals or not all(isinstance(v, (int, float)) and math.isfinite(v)
                                   for v in vals):
                raise ValueError(f"series {name!r} at p = {p}: values {vals!r} are not finite "
                                 "numbers (a NaN time cannot be fitted)")


def fit(request):
    check(request)
    import extrap
    from extrap.entities.callpath import Callpath
    from extrap.entities.coordinate import Coordinate
    from extrap.entities.experiment import Experiment
    from extrap.entities.measurement import Measurement
    from extrap.entities.metric import Metric
    from extrap.entities.parameter import Parameter
    from extrap.fileio import io_helper
    from extrap.modelers.model_generator import ModelGenerator

    param = Parameter("p")
    metric = Metric("time")
    # One experiment per hypothesis space: series with the same number of points share a modeler.
    by_space = {}
    data = {}
    for s in request["series"]:
        key = (min(len(set(s["points"])), 5), s.get("scaling", "strong"))
        by_space.setdefault(key, []).append(s)
    out = {}
    for (n_points, scaling), series in by_space.items():
        exp = Experiment()
        exp.add_parameter(param)
        exp.add_metric(metric)
        coords = {}
        for s in series:
            cp = Callpath(s["name"])
            data[s["name"]] = [(float(p), statistics.median(v))
                               for p, v in zip(s["points"], s["values"])]
            exp.add_callpath(cp)
            for p, vals in zip(s["points"], s["values"]):
                c = coords.get(float(p))
                if c is None:
                    c = coords[float(p)] = Coordinate(float(p))
                    exp.add_coordinate(c)
                exp.add_measurement(Measurement(c, cp, metric, [float(v) for v in vals]))
        exp.call_tree = io_helper.create_call_tree(exp.callpaths)
        modeler, search = _modeler(n_points, scaling)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "fewer than 5 points": the search space says so
            gen = ModelGenerator(exp, modeler=modeler)
            gen.model_all()
        for (cp, _), model in gen.models.items():
            h = model.hypothesis
            fn = h.function
            terms = []
            for t in getattr(fn, "compound_terms", []):
                poly = log = 0.0
                for st in t.simple_terms:
                    if st.term_type == "polynomial":
                        poly = float(st.exponent)
                    else:
                        log = float(st.exponent)
                terms.append({"coefficient": float(t.coefficient), "poly": poly, "log": log})
            constant = float(fn.constant_coefficient)
            note = ""
            if constant < 0 and terms:
                # A negative constant (e.g. from a superlinear step between two points) turns
                # negative when extrapolated: keep Extra-P's terms, refit without the constant.
                constant, terms, note = 0.0, _refit_without_constant(terms, data[cp.name]), \
                    "; negative constant dropped, terms refitted"
            out[cp.name] = {
                "function": _format(constant, terms),
                "constant": constant,
                "terms": terms,
                "rss": float(h.RSS), "smape": float(h.SMAPE), "ar2": float(h.AR2),
                "search": search + note,
                "values": {str(p): _evaluate(constant, terms, float(p))
                           for p in request.get("evaluate", [])},
            }
    return {"extrap_version": getattr(extrap, "__version__", "unknown"), "models": out}


if __name__ == "__main__":
    try:
        answer = fit(json.load(sys.stdin))
    except (ValueError, KeyError, TypeError) as e:  # one line for the caller's message
        sys.exit(f"extrap_fit: {type(e).__name__}: {e}")
    json.dump(answer, sys.stdout)
