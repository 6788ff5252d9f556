"""The landing page's measured results: ``{course-results}``, a table of the course's headline
figures as this build's lessons measured them, each linked to its lesson.

The figure-name contract lives here (CourseResults.SOURCES: which lesson publishes which
figure, through common.results.publish); a figure missing stops the build with its lesson's
name. speedup and ties_within_noise say how a speed-up is shown: with its
interval (one run's 95 % interval, or the range of several runs) and load, and not ranked
against another whose interval overlaps it.
"""

import json
from typing import ClassVar

from course_conf import TEXT
from course_directives import GeneratedContent
from course_sources import lesson_sources, results_folder


def speedup(ratio: float, interval: list, load: float, text: dict, *, runs: bool = False) -> str:
    """A speed-up with its interval and load: one run's 95 % interval
    (common.timing.ratio_interval) and the load it ran at, or, with ``runs``, the median of
    several processes' speed-ups, their lowest and highest, and the highest load of any."""
    low, high = interval
    return text["speedup_runs" if runs else "speedup"].format(
        ratio=ratio, low=low, high=high, load=load
    )


def accuracy_gap(accuracy: dict, text: dict) -> str:
    """How many test images apart fp32 and int8 are: 98.6 % / 98.8 % on 500 images is one image,
    not a gain from quantizing."""
    images = accuracy["test_images"]
    apart = round(abs(accuracy["fp32_accuracy"] - accuracy["int8_accuracy"]) * images)
    if apart <= 1:
        return text["accuracy_close"].format(images=images)
    return text["accuracy_apart"].format(images=images, n=apart)


def ties_within_noise(figures: dict) -> list[tuple[str, str]]:
    """Pairs of speed-ups too close to rank: their intervals overlap.

    Each interval is the lowest and highest speed-up of a path's runs, each run a process of
    its own, the paths taking turns (M03-3, step 5): two paths whose runs do not all lie on
    one side are a tie (common.timing.ranked_apart). A run's own interval would say how well
    that run's median is known, not where the next process lands.

    >>> ties_within_noise({"A": (2.0, [1.9, 2.1], 1.0), "B": (2.05, [2.0, 2.1], 1.0)})
    [('A', 'B')]
    >>> ties_within_noise({"A": (2.0, [1.9, 2.1], 1.0), "B": (3.0, [2.8, 3.2], 1.0)})
    []
    """
    names = list(figures)
    ties = []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            (_, (low_a, high_a), _), (_, (low_b, high_b), _) = figures[a], figures[b]
            if low_a <= high_b and low_b <= high_a:
                ties.append((a, b))
    return ties


class CourseResults(GeneratedContent):
    """``{course-results}`` (the landing page): the course's headline figures as the lessons
    of this build measured them, from the files they published (common.results), in a table
    that links each figure to its lesson. A figure missing is an error naming its lesson."""

    #: lesson -> the figures the table reads from what it published.
    SOURCES: ClassVar = {
        "M03-3": (
            "cpu",
            "int8_path",
            "timing_threads",
            "int8_speedup_compiled",
            "compiled_interval",
            "compiled_load",
            "int8_speedup_eager",
            "eager_intervals",
            "eager_loads",
            "size_ratio",
        ),
        "M04-1": ("test_images", "fp32_accuracy", "int8_accuracy"),
        "M04-3": ("fp32_accuracy", "ptq_accuracy", "qat_accuracy"),
        "M04-4": ("fp32_accuracy", "fp32_tuned_accuracy", "ptq_accuracy", "qat_accuracy"),
        "M02-3": ("bit_exact_cases",),
        "M08-2": (
            "unigram_perplexity",
            "perplexity_fp32",
            "perplexity_int8_xnnpack",
            "perplexity_int8_x86",
            "perplexity_int4",
        ),
        "M08-3": (
            "decode_tokens_per_s",
            "decode_interval",
            "decode_tokens_per_s_fp32",
            "timing_load",
            "pte_bytes",
        ),
    }

    def figures(self, lesson: str) -> dict:
        lang = self.config.language
        script = lesson_sources(lang)[lesson]
        path = results_folder(lang) / f"{script.stem}.json"
        if not path.exists():
            raise self.error(
                f"{path} is missing: {script.name} publishes it when it runs in this build "
                "(delete docs/<lang>/lessons/*/*.md5 to run the lessons again)"
            )
        found = json.loads(self.read(path))
        missing = [name for name in self.SOURCES[lesson] if name not in found]
        if missing:
            raise self.error(f"{script.name} published no {', '.join(missing)} (in {path})")
        return found

    def run(self) -> list:
        text = TEXT[self.config.language]
        speed, qat, real = self.figures("M03-3"), self.figures("M04-3"), self.figures("M04-4")
        accuracy, handmade = self.figures("M04-1"), self.figures("M02-3")
        language, phone = self.figures("M08-2"), self.figures("M08-3")
        native = speed["int8_path"]
        # Fastest first, so the order is the ranking (the figures' file keeps them by name);
        # pairs whose intervals overlap are named after them.
        eager = {
            path: (ratio, speed["eager_intervals"][path], speed["eager_loads"][path])
            for path, ratio in sorted(speed["int8_speedup_eager"].items(), key=lambda p: -p[1])
        }
        paths = " · ".join(f"{path} {speedup(*f, text, runs=True)}" for path, f in eager.items())
        ties = [f"{a} ≈ {b}" for a, b in ties_within_noise(eager)]
        if ties:
            paths += text["within_noise"].format(pairs=", ".join(ties))
        compiled = (
            speed["int8_speedup_compiled"],
            speed["compiled_interval"],
            speed["compiled_load"],
        )
        accuracies = ("fp32_accuracy", "ptq_accuracy", "qat_accuracy")
        rows = [
            (
                text["result_compiled"].format(path=native),
                speedup(*compiled, text),
                "M03-3",
            ),
            (text["result_eager"], paths, "M03-3"),
            (text["result_size"], f"{speed['size_ratio']:.2f}×", "M03-3"),
            (
                text["result_accuracy"].format(images=accuracy["test_images"]),
                f"{accuracy['fp32_accuracy']:.1%} / {accuracy['int8_accuracy']:.1%}"
                + accuracy_gap(accuracy, text),
                "M04-1",
            ),
            (text["result_qat"], " / ".join(f"{qat[k]:.1%}" for k in accuracies), "M04-3"),
            (
                text["result_qat_real"],
                " / ".join(f"{real[k]:.1%}" for k in self.SOURCES["M04-4"]),
                "M04-4",
            ),
            (
                text["result_perplexity"].format(unigram=language["unigram_perplexity"]),
                " / ".join(f"{language[k]:.3f}" for k in self.SOURCES["M08-2"][1:]),
                "M08-2",
            ),
            (
                text["result_decode"].format(kb=phone["pte_bytes"] / 1000),
                text["tokens_per_s"].format(
                    pte=phone["decode_tokens_per_s"],
                    low=phone["decode_interval"][0],
                    high=phone["decode_interval"][1],
                    fp32=phone["decode_tokens_per_s_fp32"],
                    load=phone["timing_load"],
                ),
                "M08-3",
            ),
            (
                text["result_bit_exact"],
                text["result_cases"].format(n=handmade["bit_exact_cases"]),
                "M02-3",
            ),
        ]
        out = [
            f":::{{list-table}} {text['results_caption']}",
            ":header-rows: 1",
            ":class: course-results",
            "",
        ]
        what, value, lesson = text["results_head"]
        out += [f"* - {what}", f"  - {value}", f"  - {lesson}"]
        for what, value, lesson in rows:
            out += [f"* - {what}", f"  - {value}", f"  - {{lesson}}`{lesson}`"]
        out += [":::", ""]
        note = text["results_note"]
        out += [note.format(cpu=speed["cpu"], threads=speed["timing_threads"], native=native), ""]
        return self.parse("\n".join(out), lists_lessons=False)


def setup(app) -> dict:
    app.add_directive("course-results", CourseResults)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
