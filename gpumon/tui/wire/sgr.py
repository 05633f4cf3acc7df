"""Terminal text attributes (SGR, `ESC [ … m`) as values, and the shortest change from one to another.

Rich writes every styled segment as `ESC[<all attributes>m text ESC[0m`: about 25 bytes of
attributes around each piece of text. Knowing what the terminal has now, only the attributes that
differ need sending (a new foreground colour: `ESC[38;5;77m`), as curses does.

A state is a tuple of slots (see SLOTS); a parameter string this module does not understand
(colon sub-parameters, private extensions) makes the state opaque: `("raw", params)`, always sent
in full after a reset, so nothing it does not know is ever lost.
"""

from __future__ import annotations

from functools import lru_cache

# intensity (bits: 1 bold, 2 dim), italic, underline (4 or 21), blink (5 or 6), reverse, conceal,
# strike, fg, bg, frame (51 or 52), overline, underline colour
SLOTS = ("intensity", "italic", "underline", "blink", "reverse", "conceal", "strike", "fg", "bg", "frame",
         "overline", "underline_color")
State = tuple
DEFAULT: State = (0, False, 0, 0, False, False, False, None, None, 0, False, None)

_ON = {3: (1, True), 7: (4, True), 8: (5, True), 9: (6, True), 53: (10, True),
       4: (2, 4), 21: (2, 21), 5: (3, 5), 6: (3, 6), 51: (9, 51), 52: (9, 52)}
_OFF = {23: 1, 24: 2, 25: 3, 27: 4, 28: 5, 29: 6, 54: 9, 55: 10, 39: 7, 49: 8, 59: 11}
# The code that turns each boolean / small slot off again.
_OFF_CODE = {1: "23", 2: "24", 3: "25", 4: "27", 5: "28", 6: "29", 9: "54", 10: "55", 7: "39", 8: "49", 11: "59"}
_ON_CODE = {1: "3", 4: "7", 5: "8", 6: "9", 10: "53"}


def _colour(codes: list[int], i: int) -> tuple[str, int] | None:
    """An extended colour (38/48/58 ; 5 ; n  or  ; 2 ; r ; g ; b) starting at codes[i]."""
    if i + 2 < len(codes) and codes[i + 1] == 5:
        return f"{codes[i]};5;{codes[i + 2]}", i + 3
    if i + 1 < len(codes) and codes[i + 1] == 2 and i + 4 < len(codes):
        return f"{codes[i]};2;{codes[i + 2]};{codes[i + 3]};{codes[i + 4]}", i + 5
    return None


@lru_cache(maxsize=4096)
def apply(state: State, params: str) -> State:
    """The state after `ESC [ params m`."""
    if state[0] == "raw":
        first = params.split(";", 1)[0]
        return apply(DEFAULT, params) if first in ("", "0") else ("raw", f"{state[1]};{params}")
    try:
        codes = [int(p) if p else 0 for p in params.split(";")]
    except ValueError:  # colon sub-parameters and the like: keep them verbatim
        return ("raw", f"{full(state)};{params}" if state != DEFAULT else params)
    slots = list(state)
    i = 0
    while i < len(codes):
        code = codes[i]
        i += 1
        if code == 0:
            slots = list(DEFAULT)
        elif code in (1, 2):
            slots[0] |= code
        elif code == 22:
            slots[0] = 0
        elif code in _ON:
            slot, value = _ON[code]
            slots[slot] = value
        elif code in _OFF:
            slots[_OFF[code]] = DEFAULT[_OFF[code]]
        elif 30 <= code <= 37 or 90 <= code <= 97:
            slots[7] = str(code)
        elif 40 <= code <= 47 or 100 <= code <= 107:
            slots[8] = str(code)
        elif code in (38, 48, 58):
            colour = _colour(codes, i - 1)
            if colour is None:
                return ("raw", f"{full(state)};{params}" if state != DEFAULT else params)
            slots[{38: 7, 48: 8, 58: 11}[code]], i = colour
        else:
            return ("raw", f"{full(state)};{params}" if state != DEFAULT else params)
    return tuple(slots)


@lru_cache(maxsize=4096)
def full(state: State) -> str:
    """Parameters that set `state` from the default."""
    if state[0] == "raw":
        return state[1]
    codes = []
    if state[0] & 1:
        codes.append("1")
    if state[0] & 2:
        codes.append("2")
    for slot in (1, 4, 5, 6, 10):
        if state[slot]:
            codes.append(_ON_CODE[slot])
    for slot in (2, 3, 9):
        if state[slot]:
            codes.append(str(state[slot]))
    for slot in (7, 8, 11):
        if state[slot] is not None:
            codes.append(state[slot])
    return ";".join(codes)


@lru_cache(maxsize=8192)
def change(old: State, new: State) -> str:
    """The shortest `ESC [ … m` that turns `old` into `new` ("" when they are equal)."""
    if old == new:
        return ""
    reset = f"\x1b[0;{full(new)}m" if new != DEFAULT else "\x1b[0m"
    if old[0] == "raw" or new[0] == "raw":
        return reset
    codes = []
    if old[0] != new[0]:
        if old[0] & ~new[0]:  # bold or dim goes: 22 clears both
            codes.append("22")
            if new[0] & 1:
                codes.append("1")
            if new[0] & 2:
                codes.append("2")
        else:
            codes.extend(str(bit) for bit in (1, 2) if new[0] & bit and not old[0] & bit)
    for slot in range(1, len(DEFAULT)):
        if old[slot] == new[slot]:
            continue
        if new[slot] in (None, False, 0):
            codes.append(_OFF_CODE[slot])
        elif slot in _ON_CODE:
            codes.append(_ON_CODE[slot])
        else:
            codes.append(str(new[slot]))
    step = f"\x1b[{';'.join(codes)}m"
    return step if len(step) < len(reset) else reset


# Attributes that show on a blank cell; when none is set, a blank's foreground, bold, italic and
# blink cannot be seen, so blanks compare equal whatever they are, and keep the terminal's.
_SHOWS_ON_BLANK = (2, 4, 6, 9, 10)  # underline, reverse, strike, frame, overline


@lru_cache(maxsize=4096)
def blank(state: State) -> State:
    """What a blank cell in `state` looks like: the attributes it cannot show are dropped."""
    if state[0] == "raw" or any(state[slot] for slot in _SHOWS_ON_BLANK):
        return state
    return (0, False, state[2], 0) + state[4:7] + (None,) + state[8:]


@lru_cache(maxsize=4096)
def blank_over(current: State | None, wanted: State) -> State:
    """The state to draw blanks of `wanted` (a `blank()` state) in, changing as little of the
    terminal's `current` state as possible."""
    if current is None or current[0] == "raw" or wanted[0] == "raw" or blank(wanted) != wanted:
        return wanted
    if any(current[slot] or wanted[slot] for slot in _SHOWS_ON_BLANK):
        return wanted
    return (current[0], current[1], wanted[2], current[3]) + wanted[4:7] + (current[7],) + wanted[8:]
