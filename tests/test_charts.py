"""common.charts: the course's CJK font for charts (the gallery refuses a chart without it) and
display widths for printed tables."""

import re

import pytest
from lesson_scripts import ROOT


@pytest.fixture
def pyplot():
    import matplotlib

    matplotlib.use("agg")
    import matplotlib.pyplot as plt

    with matplotlib.rc_context():  # each test starts from, and leaves, matplotlib's defaults
        matplotlib.rcdefaults()
        yield plt
        plt.close("all")


def test_course_style_sets_the_cjk_font_and_a_second_call_changes_nothing(pyplot):
    import matplotlib as mpl

    from common.charts import CJK_FONTS, use_course_style

    font = use_course_style()
    first = dict(mpl.rcParams)
    assert font in CJK_FONTS and mpl.rcParams["font.sans-serif"] == [font, "DejaVu Sans"]
    assert use_course_style() == font and dict(mpl.rcParams) == first


def test_chinese_labels_are_drawn_with_cjk_glyphs(pyplot):
    from matplotlib import font_manager

    from common.charts import use_course_style

    from course_gallery import missing_glyphs

    figure, axes = pyplot.subplots()
    axes.set_title("校準後的 scale")
    assert missing_glyphs(figure), "matplotlib's default font has no Chinese glyphs"
    use_course_style()
    figure, axes = pyplot.subplots()
    title = axes.set_title("校準後的 scale")
    axes.set_xlabel("數值 −1")
    assert missing_glyphs(figure) == []
    path = font_manager.findfont(title.get_fontproperties(), fallback_to_default=False)
    assert font_manager.get_font(path).get_char_index(ord("校")), path


def test_the_gallery_refuses_a_chart_whose_chinese_has_no_font(pyplot):
    from course_gallery import check_chart_glyphs

    pyplot.subplots()[1].set_ylabel("準確度")
    with pytest.raises(RuntimeError, match=r"'度' of '準確度'.*use_course_style\(\)"):
        check_chart_glyphs()


def test_the_font_is_set_in_one_place_for_the_course():
    """Charts get their font from use_course_style; the gallery resets matplotlib per lesson."""
    from course_conf import make_config

    gallery = make_config("en")["sphinx_gallery_conf"]
    assert "matplotlib" in gallery["image_scrapers"] and "matplotlib" in gallery["reset_modules"]
    font_setting = re.compile(r"rcParams\[.font\.|rc\(.font|font_manager|fontproperties|fontname")
    for path in sorted((ROOT / "examples").rglob("*.py")):
        code = path.read_text(encoding="utf-8")
        assert not font_setting.search(code), f"{path.name} sets a font; use use_course_style()"
        if "matplotlib" in code:
            assert "use_course_style()" in code, f"{path.name} charts without use_course_style()"


@pytest.mark.parametrize(
    ("text", "width"),
    [("recipe", 6), ("配方", 4), ("x86 預設設定", 12), ("int8 q/dq（模擬）", 17), ("2.83×", 5)],
)
def test_display_width_counts_two_columns_per_chinese_character(text, width):
    from common.charts import display_width

    assert display_width(text) == width


def test_pad_lines_up_chinese_and_ascii_cells_by_columns():
    from common.charts import display_width, pad

    assert pad("配方", 8) == "配方    " and pad("配方", 8, align=">") == "    配方"
    labels = ["便宜的配方", "HistogramObserver", "x86 預設設定 + reduce_range"]
    left = [pad(label, 30) + "|" for label in labels]
    assert {display_width(line) for line in left} == {31}
    assert left[1] == f"{labels[1]:<30}|" and pad(labels[1], 30, align=">") == f"{labels[1]:>30}"
    assert pad("便宜的配方", 4) == "便宜的配方", "a cell wider than its column is not cut"
    with pytest.raises(ValueError, match="align must be '<' or '>'"):
        pad("配方", 8, align="^")
