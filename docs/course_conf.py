"""Sphinx configuration shared by the per-language builds (docs/<lang>/conf.py)."""

import os
import re

# The repository, the site's address and the languages are facts that nox and the tests
# read without Sphinx: docs/site_facts.py.
from site_facts import COURSE_REPOSITORY, DOCS, ROOT, SITE_URL, other_language

TEXT = {
    "zh_TW": {
        "project": "PT2E 量化：從圖開始",
        "search_bar_text": "搜尋課程內容…",
        "copyright": "2026 pt2e-course 貢獻者",
        "short_title": "PT2E 量化：從圖開始",
        "gallery_title": "課程",
        "language_name": "繁體中文",
        "hreflang": "zh-Hant-TW",
        "switch_title": "閱讀本頁的繁體中文版",
        "colab": "在 Colab 開啟",
        "colab_title": "在 Google Colab 執行本課的筆記本",
        "used_in": "用到它的課程",
        "first_cell": (
            "# 在 Google Colab 執行時，這一格會安裝課程（連同它指定版本的 torch 與 torchao）\n"
            "# 以及 Graphviz 和中文字型；在自己的電腦上它什麼都不做，\n"
            "# 請用課程頁面上的同一個指令安裝：\n"
            f'# pip install "pt2e-course @ git+{COURSE_REPOSITORY}"\n'
        ),
        # The landing page's measured results (course_results.CourseResults), the report link and
        # the built-with line of a lesson page, the line beside the download buttons.
        "results_caption": "課程的重點數字，各連到量測它的那一課",
        "results_head": ("量測項目", "本次建置", "出處"),
        "result_compiled": "int8 比 fp32 快幾倍：兩者都以 ``torch.compile`` 加 freezing 編譯，"
        "本 CPU 的 int8 路徑（{path}）",
        "result_eager": "int8 比 fp32 快幾倍：eager 模式（下放後的 int8 運算），各 int8 路徑"
        "各在五個行程量測、輪流進行（本 CPU 的路徑量兩次：同一條路徑不會和自己分出高下）",
        "result_size": "int8 程式存檔大小 ÷ fp32",
        "result_accuracy": "手寫數字測試集準確度（{images} 張）：fp32／int8（x86 預設設定）",
        "accuracy_close": "（{images} 張中相差不超過一張）",
        "accuracy_apart": "（{images} 張中相差 {n} 張）",
        "result_qat": "per-tensor weight、有離群通道的模型：fp32／PTQ／QAT",
        "result_qat_real": "真實架構 MobileNetV2（XNNPACK、per-tensor weight、有離群通道）："
        "fp32／以 QAT 的排程微調的 fp32（同樣的 epoch）／PTQ／QAT",
        "result_perplexity": "字元級語言模型在保留文字上的困惑度"
        "（只看字元頻率時為 {unigram:.1f}）：fp32／int8 動態（XNNPACK）／"
        "int8 動態（x86，``torch.compile``）／8da4w（int4 權重）",
        "result_decode": "同一個模型的 8da4w ``.pte``（{kb:.0f} kB）在 ExecuTorch runtime 上"
        "逐字解碼的速度",
        "tokens_per_s": "每秒 {pte:.0f} 個 token（95% 區間 {low:.0f}–{high:.0f}；eager fp32 每秒 "
        "{fp32:.0f} 個；負載 {load:.2f}）",
        "result_bit_exact": "親手寫的 prepare + convert 和 torchao 逐位元相同",
        "result_cases": "{n} 個案例（模型庫的模型 × 2 個 quantizer）",
        "speedup": "{ratio:.2f}×（95% 區間 {low:.2f}–{high:.2f}×，負載 {load:.2f}）",
        "speedup_runs": "{ratio:.2f}×（五次執行介於 {low:.2f}–{high:.2f}×，負載最高 {load:.2f}）",
        "within_noise": "；{pairs}：區間重疊，不分高下",
        "results_note": (
            "量測環境：{cpu}。時間是 {threads} 個執行緒、交錯多輪的中位數（單一執行緒時計的是"
            "每次呼叫的 CPU 時間，多個執行緒時計的是實際經過的時間）。量測時，另一種語言的建置"
            "會暫停等候。這些時間只印出、從不 ``assert``，並且會隨機器負載變動；每個時間只量"
            "一次，兩種語言顯示同樣的數字。編譯後的區間只涵蓋一次執行：加速倍數的 95% 信賴區間"
            "（由 100 輪的順序統計量得出中位數的區間，兩個中位數都取最壞的一端，並假設各輪獨立），"
            "同一個模型換一個行程再量，水準可能移動得比它還多。eager 各路徑的範圍是五次執行"
            "（五個行程，各路徑輪流）的最小值到最大值；一條路徑的每次執行都勝過另一條時，兩者"
            "才分高下。負載是一分鐘的平均負載；{native} "
            "以外的路徑是在同一顆 CPU 上用 ``ONEDNN_MAX_CPU_ISA`` 限制出來的，不是真正較舊的"
            "晶片。"
        ),
        "report": "回報本頁問題",
        "report_title": "在課程的儲存庫開一個 issue，回報本頁的問題",
        "report_issue_title": "本頁有問題：{title}",
        "report_issue_body": "頁面：{address}\n\n問題：\n",
        "built_with": "建置環境：{stack} · 本課執行於 {date}",
        "run_needs": "要執行下載的 ``.py``，需要先安裝課程的輔助模組（連同指定版本的 torch 與 "
        "torchao）：{command}，以及 Graphviz（``sudo apt-get install graphviz``）",
        "run_needs_compiler": "；``torch.compile`` 還需要 C++ 編譯器（``g++``）",
        "run_needs_end": "。",
    },
    "en": {
        "project": "PT2E quantization from the graph up",
        "search_bar_text": "Search the docs ...",  # the theme's own default
        "copyright": "2026, pt2e-course contributors",
        "short_title": "PT2E from the graph up",
        "gallery_title": "Lessons",
        "language_name": "English",
        "hreflang": "en",
        "switch_title": "Read this page in English",
        "colab": "Open in Colab",
        "colab_title": "Run this lesson's notebook in Google Colab",
        "used_in": "Lessons that use it",
        "first_cell": (
            "# In Google Colab this cell installs the course (with its pinned torch and\n"
            "# torchao), Graphviz and a CJK font. On your own machine it does nothing: install\n"
            "# the course there with the command the lesson page gives:\n"
            f'# pip install "pt2e-course @ git+{COURSE_REPOSITORY}"\n'
        ),
        # The landing page's measured results (course_results.CourseResults), the report link and
        # the built-with line of a lesson page, the line beside the download buttons.
        "results_caption": "The course's headline figures, each with the lesson that measured it",
        "results_head": ("What", "This build", "Lesson"),
        "result_compiled": "int8 speed-up over fp32, both compiled with ``torch.compile`` and "
        "freezing, on this CPU's int8 path ({path})",
        "result_eager": "int8 speed-up over fp32, eager (lowered int8 ops), on each int8 path, "
        "five processes each, taking turns (this CPU's path twice: a path is not ranked against "
        "itself)",
        "result_size": "Size of the saved int8 program ÷ fp32",
        "result_accuracy": "Digits test accuracy ({images} images): fp32 / int8 (x86 defaults)",
        "accuracy_close": " (within one image of {images})",
        "accuracy_apart": " ({n} images of {images} apart)",
        "result_qat": "Per-tensor weights, a model with an outlier channel: fp32 / PTQ / QAT",
        "result_qat_real": "A real architecture, MobileNetV2 (XNNPACK, per-tensor weights, an "
        "outlier channel): fp32 / fp32 fine-tuned on QAT's schedule (same epochs) / PTQ / QAT",
        "result_perplexity": "A character-level language model's held-out perplexity "
        "(character frequencies alone: {unigram:.1f}): fp32 / int8 dynamic (XNNPACK) / "
        "int8 dynamic (x86, ``torch.compile``) / 8da4w (int4 weights)",
        "result_decode": "The same model as an 8da4w ``.pte`` ({kb:.0f} kB) on the ExecuTorch "
        "runtime, decoding one token per call",
        "tokens_per_s": "{pte:.0f} tokens/s (95 % interval {low:.0f}–{high:.0f}; eager fp32: "
        "{fp32:.0f} tokens/s; load {load:.2f})",
        "result_bit_exact": "Handmade prepare + convert, bit-exact with torchao",
        "result_cases": "{n} cases (the zoo's models × 2 quantizers)",
        "speedup": "{ratio:.2f}× (95 % interval {low:.2f}–{high:.2f}×, load {load:.2f})",
        "speedup_runs": "{ratio:.2f}× (five runs within {low:.2f}–{high:.2f}×, "
        "load up to {load:.2f})",
        "within_noise": "; {pairs}: intervals overlap, not ranked",
        "results_note": (
            "Measured on {cpu}. Times are medians of interleaved rounds on {threads} thread(s) "
            "(each call's CPU time on one thread, its wall time on more), taken while the other "
            "language's build waits, printed and never asserted, and they move with the machine's "
            "load; each is measured "
            "once and both languages show it. The compiled speed-up's interval covers one run: "
            "its 95 % confidence interval (each median's from the order statistics of 100 "
            "rounds, both taken at their worst, for independent rounds); the same model timed in "
            "another process may move by more. The eager paths' ranges are the lowest and "
            "highest of five runs (five processes, the paths taking turns); two paths are ranked "
            "only when every run of one beats every run of the other. "
            "The load is the one-minute load average; the paths other "
            "than {native} are capped with ``ONEDNN_MAX_CPU_ISA`` on the same CPU, not a real "
            "older chip."
        ),
        "report": "Report a problem",
        "report_title": "Open an issue in the course's repository about this page",
        "report_issue_title": "Problem on the page: {title}",
        "report_issue_body": "Page: {address}\n\nWhat is wrong:\n",
        "built_with": "Built with {stack} · this lesson ran on {date}",
        "run_needs": "Running the downloaded ``.py`` needs the course's helpers with their "
        "pinned torch and torchao, {command}, and Graphviz (``sudo apt-get install graphviz``)",
        "run_needs_compiler": "; ``torch.compile`` also needs a C++ compiler (``g++``)",
        "run_needs_end": ".",
    },
}

_FIRST_CELL_CODE = f"""import sys

if "google.colab" in sys.modules:
    import subprocess

    subprocess.run(
        "apt-get -qq update && apt-get -qq install -y graphviz fonts-wqy-microhei",
        shell=True,
        check=False,
    )
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet",
         "pt2e-course @ git+{COURSE_REPOSITORY}"],
        check=True,
    )"""


#: The environment variable that names the lessons to build alone (``nox -s docs -- --lesson``):
#: file-name prefixes, comma-separated (``m07_4`` or ``m07_4,quickstart``).
LESSON_VARIABLE = "PT2E_COURSE_LESSON"


def selected_lessons(value: str | None = None) -> list[str]:
    """The lesson-name prefixes ``PT2E_COURSE_LESSON`` names; [] builds every lesson.

    >>> selected_lessons("m07_4, quickstart")
    ['m07_4', 'quickstart']
    """
    value = os.environ.get(LESSON_VARIABLE, "") if value is None else value
    return [part.strip() for part in value.split(",") if part.strip()]


def filename_pattern(selected: list[str]) -> str:
    r"""sphinx-gallery's ``filename_pattern``: every script, or those whose name starts with
    one of ``selected``.

    >>> filename_pattern(["m07_4"])
    '/(m07_4)[^/]*\\.py$'
    """
    if not selected:
        return r"\.py$"
    return "/(" + "|".join(re.escape(name) for name in selected) + r")[^/]*\.py$"


def module_folders(lang: str) -> list[str]:
    """The course's modules, each a gallery: the folders of examples/<lang> with a README.txt.

    In reading order: the quickstart first, then M00, M01, ... by name, troubleshooting last.
    A new module is a new folder; nothing else needs to list it.
    """
    found = {p.parent.name for p in (ROOT / "examples" / lang).glob("*/README.txt")}
    first = [name for name in ("quickstart",) if name in found]
    last = [name for name in ("troubleshooting",) if name in found]
    return first + sorted(found - set(first) - set(last)) + last


def _quiet_kernels() -> None:
    """Keep the Jupyter kernel that runs the FX article's cells from warning on every build.

    ipykernel warns that its local TCP sockets are unencrypted. The kernels myst-nb starts
    inherit IPYTHONDIR and read their settings from its default profile.
    """
    profile = ROOT / "build" / "ipython" / "profile_default"
    profile.mkdir(parents=True, exist_ok=True)
    (profile / "ipython_kernel_config.py").write_text('c.IPKernelApp.log_level = "ERROR"\n')
    os.environ["IPYTHONDIR"] = str(profile.parent)


def make_config(lang: str) -> dict:
    """Return the Sphinx settings for one language ("zh_TW" or "en")."""
    _quiet_kernels()
    # torch.compile's compiled kernels (M03-3) are cached here: rebuilds do not recompile.
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(ROOT / "build" / "inductor_cache"))
    text = TEXT[lang]
    other = other_language(lang)
    modules = module_folders(lang)
    # The two languages build at once and share one cache (trained weights, the atlas, lowered
    # programs), each entry made by the first build that needs it while the other waits. The
    # Chinese build runs the modules last to first, so that on a cold build each makes about
    # half of the entries while the other computes, instead of one core idling. Pages keep
    # the course's order: the toctrees list module_folders(lang), not this.
    run_order = modules if lang == "en" else modules[::-1]
    return {
        "project": text["project"],
        "author": "pt2e-course contributors",
        "copyright": text["copyright"],
        "language": lang,
        "extensions": [
            "myst_nb",
            "sphinx_gallery.gen_gallery",
            "sphinx_design",
            "sphinx.ext.autodoc",
            "sphinx.ext.napoleon",
            "sphinx_copybutton",
            # The site's own extensions, one job each (docs/<name>.py):
            "course_directives",  # course map, module cards, lessons index, {lesson} role
            "course_results",  # the landing page's measured results
            "course_api",  # the API page: a section per module of common/, lessons using each name
            "course_links",  # per page: twin page, Colab, report, built-with, run-needs line
            "course_gallery_tidy",  # sphinx-gallery's pages tidied: lesson top, thumbnails, zh
            "course_rerun",  # lessons run again, pages read again, when their other inputs change
            "course_kernel_lock",  # one Jupyter kernel at a time across the two builds
            "course_sitemap",  # <lang>/sitemap.xml, every page with its twin; no theme macros
            "course_a11y",  # docs/course_a11y.py: accessibility fixes to the theme's markup
            "zh_spacing",  # docs/zh_spacing.py: no stray spaces in Chinese text
            "course_search_zh",  # zh_TW search: the index and the query split alike
            "course_anchors",  # a lesson's section ids are its English twin's, in both languages
        ],
        "html_theme": "pydata_sphinx_theme",
        # The theme's interface strings in Traditional Chinese (docs/locale/zh_TW/LC_MESSAGES/
        # sphinx.po; Sphinx compiles it to sphinx.mo beside it).
        "locale_dirs": [str(DOCS / "locale")],
        # Pages without sections of their own need no left sidebar.
        "html_sidebars": {
            page: [] for page in ("index", "course_map", "glossary", "fx_basics", "api")
        },
        "html_title": text["project"],
        "html_baseurl": f"{SITE_URL}{lang}/",
        "templates_path": [str(DOCS / "_templates")],
        "html_static_path": [str(DOCS / "_static")],
        # zh_TW pages: sphinx-gallery's "Out:" label in Chinese (course-zh-tw.css).
        "html_css_files": ["course.css"] + (["course-zh-tw.css"] if lang == "zh_TW" else []),
        # Workaround for sphinx-doc/sphinx#14229 (Chinese search stops: "ChineseStemmer is not
        # defined"), fixed by sphinx-doc/sphinx#14416, which the pinned Sphinx 9.0.4 lacks;
        # delete docs/_static/chinese-stemmer.js with the first Sphinx release that has it.
        # copybutton-zh-tw.js: the copy buttons' tooltips in Traditional Chinese.
        "html_js_files": ["chinese-stemmer.js", "copybutton-zh-tw.js"] if lang == "zh_TW" else [],
        "html_context": {
            "other_lang_name": TEXT[other]["language_name"],
            "other_lang_hreflang": TEXT[other]["hreflang"],
            "other_lang_title": TEXT[other]["switch_title"],
            "colab_label": text["colab"],
            "colab_title": text["colab_title"],
            # The theme's own default, given explicitly: unset, its script reads an empty mode
            # and logs "Got invalid theme mode" on every page.
            "default_mode": "auto",
        },
        "html_theme_options": {
            "navigation_with_keys": False,
            "logo": {"text": text["short_title"]},
            "show_toc_level": 2,
            "search_bar_text": text["search_bar_text"],
            "navbar_end": ["language-switch", "theme-switcher", "navbar-icon-links"],
            # The report link closes the page, beside the built-with line: the first control
            # of a page is the way in (the landing page's quickstart, a lesson's Colab link).
            "article_header_end": ["colab-link"],
            "article_footer_items": ["built-with", "report-problem"],
            "footer_start": ["copyright"],
            "footer_end": [],
        },
        "html_show_sourcelink": False,
        # Chinese pages are searched with the course's splitter (docs/course_search_zh.py).
        "html_search_language": "zh" if lang == "zh_TW" else "en",
        "exclude_patterns": [
            "_build",
            # The gallery writes its .py/.ipynb downloads next to the pages; they are not
            # Sphinx sources (myst-nb would read the notebooks and run them again).
            "lessons/**/*.ipynb",
            "lessons/**/*.py",
            "lessons/**/*.zip",
        ],
        "myst_enable_extensions": ["colon_fence", "deflist"],
        # The API page (api.md, its sections generated from common/ by docs/course_api.py).
        "autodoc_member_order": "bysource",
        # A member without a docstring of its own (a model's forward) stays off the API page
        # rather than showing the one it inherits (torch.nn.Module's "Define the computation
        # performed at every call"), which says nothing about the course's code.
        "autodoc_inherit_docstrings": False,
        "autodoc_typehints": "description",
        "napoleon_numpy_docstring": False,
        "html_domain_indices": False,
        # Copy buttons copy the code only: not on output blocks, and without >>> prompts.
        "copybutton_selector": "div:not(.sphx-glr-script-out):not(.output) > div.highlight > pre",
        "copybutton_prompt_text": r">>> |\.\.\. ",
        "copybutton_prompt_is_regexp": True,
        # The FX article's cells run in a Jupyter kernel. Not "inline": that mode starts the
        # same kernel, and a failing assert then stops the build without the assertion's text.
        "nb_execution_mode": "cache",
        "nb_execution_show_tb": True,  # a failing cell's code and traceback in the build output
        "nb_execution_cache_path": str(ROOT / "build" / "jupyter_cache" / lang),
        "nb_execution_raise_on_error": True,
        "nb_execution_timeout": 300,
        "sphinx_gallery_conf": {
            # One gallery per module (as sphinx-gallery's own doc/conf.py has several), so
            # that each module's page offers its lessons as .py and .ipynb zips. Paths are
            # relative to docs/<lang>/, and a page's label and URL follow its gallery path:
            # sphx_glr_lessons_<module>_<file>.py, lessons/<module>/<file>.html.
            "examples_dirs": [f"../../examples/{lang}/{module}" for module in run_order],
            "gallery_dirs": [f"lessons/{module}" for module in run_order],
            # Every script runs (a page shows what its code does), or with PT2E_COURSE_LESSON
            # set only the lessons it names: the others' pages stay as their last run made them.
            "filename_pattern": filename_pattern(selected_lessons()),
            "ignore_pattern": r"__init__\.py",
            # The course's graph pictures, then sphinx-gallery's own matplotlib charts.
            "image_scrapers": ("course_gallery.scraper", "matplotlib"),
            # Code cells link the names of common/ to the API page, and the API page lists, for
            # each function, the lessons that use it (the "minigallery" directive reads these).
            "doc_module": ("common",),
            "backreferences_dir": str(ROOT / "build" / "backreferences" / lang),
            "reset_modules": ("matplotlib", "course_gallery.reset"),
            # A lesson that raises must fail the build, never become a page with a traceback.
            "abort_on_example_error": True,
            "only_warn_on_example_error": False,
            "capture_repr": (),
            "write_computation_times": False,
            "download_all_examples": True,
            "remove_config_comments": True,
            "show_signature": False,
            "plot_gallery": "True",
            # Lessons in course order (the default sorts by number of code lines).
            "within_subsection_order": "FileNameSortKey",
            "min_reported_time": 3600,
            # Harmless locally, makes the notebook run in a fresh Colab runtime.
            "first_notebook_cell": text["first_cell"] + _FIRST_CELL_CODE,
        },
    }
