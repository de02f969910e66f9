"""Reading Rust source as text, shared by the scripts/check-* checks."""
import re


def code_only(text):
    """The text with comments, string, raw-string and char literals blanked:
    one pass, so a quote inside a comment or a `//` inside a string does
    not hide the code after it."""
    out, i, n = [], 0, len(text)
    ident = lambda c: c.isalnum() or c == "_"
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif c in "rb" and (i == 0 or not ident(text[i - 1])) and re.match(r'(?:br|r)#*"', text[i:]):
            m = re.match(r'(?:br|r)(#*)"', text[i:])
            close = '"' + m.group(1)
            j = text.find(close, i + m.end())
            out.append('""')
            i = n if j < 0 else j + len(close)
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('""')
            i = j + 1
        elif c == "'" and re.match(r"'(?:\\.|\\u\{[0-9a-fA-F]+\}|[^'\\\n])'", text[i:]):
            m = re.match(r"'(?:\\.|\\u\{[0-9a-fA-F]+\}|[^'\\\n])'", text[i:])
            out.append("' '")
            i += m.end()
        else:
            out.append(c)
            i += 1
    return "".join(out)
