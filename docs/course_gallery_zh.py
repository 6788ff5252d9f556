"""sphinx-gallery's English phrases in Chinese on the zh_TW pages.

sphinx-gallery writes these phrases into every page it generates (the link to the download
buttons, the buttons' labels) and has no message catalog of its own, so they are swapped in
the generated reST as Sphinx reads it. A job of its own: it changes the gallery's words, not
what a page links to (course_links.py).
"""

#: sphinx-gallery's phrase -> the zh_TW page's.
GALLERY_ZH_TW = {
    "`Go to the end <": "`前往頁尾 <",
    "to download the full example code.": "下載完整的程式碼。",
    "Download Jupyter notebook: ": "下載 Jupyter 筆記本：",
    "Download Python source code: ": "下載 Python 原始碼：",
    "Download zipped: ": "下載 zip 壓縮檔：",
    "Download all examples in Python source code: ": "下載本單元的全部課程（Python 原始碼）：",
    "Download all examples in Jupyter notebooks: ": "下載本單元的全部課程（Jupyter 筆記本）：",
}


def _translate(app, docname: str, source: list[str]) -> None:
    if app.config.language != "zh_TW" or not docname.startswith("lessons/"):
        return
    for english, chinese in GALLERY_ZH_TW.items():
        source[0] = source[0].replace(english, chinese)


def setup(app) -> dict:
    app.connect("source-read", _translate)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
