"""The one font and the one palette of every figure of the lab.

Okabe-Ito colours: told apart by colour-blind readers and on a washed-out projector. A
colour means the same thing on every figure: a CP layer, the activations and the
checkpointed run are vermillion; a keep layer, the parameters and checkpointing off blue.
Streamlit's plotly.js (4.x) draws nothing for a pattern with an rgba fgcolor: hex colours only.
"""

from __future__ import annotations

FONT = "Arial, Helvetica, sans-serif"

# Okabe-Ito, by name.
BLUE = "#0072B2"
VERMILLION = "#D55E00"
ORANGE = "#E69F00"
SKY_BLUE = "#56B4E9"
GREEN = "#009E73"
PURPLE = "#CC79A7"
YELLOW = "#F0E442"
BLACK = "#000000"
GREY = "#999999"
LIGHT_GREY = "#BBBBBB"
GRID = "#e5e5e5"
LIGHT_GRID = "#f0f0f0"

# The diagram's roles; planned rows are hatched in each colour a quarter of the way to white.
ROLE_COLORS = {"CP": VERMILLION, "rerun": ORANGE, "keep": BLUE}
HATCH_COLORS = {"CP": "#E69766", "rerun": "#EDBD59", "keep": "#4095C5"}

# Settings: checkpointing off keeps every layer (the keep colour), the checkpointed run is CP's.
OFF_COLOR = BLUE
RUN_COLOR = VERMILLION
EXTRA_COLORS = (PURPLE, GREEN, YELLOW, BLACK)  # further settings beside those two
SERIES_COLORS = (BLUE, VERMILLION, GREEN, PURPLE, ORANGE, SKY_BLUE, YELLOW, BLACK)  # one per line, in order

# Where the bytes of a step go (ckptlab.step.meters' categories), and offload's host memory.
CATEGORY_COLORS = {
    "parameter": BLUE,
    "gradient": SKY_BLUE,
    "optimizer_state": GREEN,
    "activation": VERMILLION,
    "temp": ORANGE,
    "activation_and_temp": VERMILLION,
    "other": BLACK,
    "host": PURPLE,
}
HOST_PATTERN = {"shape": "/", "bgcolor": "#F5E1EC", "fgcolor": PURPLE, "size": 8, "solidity": 0.45}

# The stretches of a step, and the state of a layer at one moment of it.
BAND_COLORS = {"forward": SKY_BLUE, "loss": GREY, "backward": GREEN, "rerun": ROLE_COLORS["rerun"], "optimizer": ORANGE}
STATE_COLORS = {
    "pending": "#E8E8E8",
    "running": SKY_BLUE,
    "held": ROLE_COLORS["keep"],
    "input_only": ROLE_COLORS["CP"],
    "recomputing": ROLE_COLORS["rerun"],
    "backward": GREEN,
    "freed": LIGHT_GREY,
}
CURSOR_COLOR = "#222222"

# Sweeps: what was measured, the two predictions, the frontier and a budget.
MEASURED_COLOR = BLUE
FORMULA_COLOR = ORANGE
CALIBRATED_COLOR = SKY_BLUE
FRONTIER_COLOR = VERMILLION
BUDGET_COLOR = BLACK
GUESS_COLOR = PURPLE  # a participant's prediction in an exercise
FIT_COLORS = {True: GREEN, False: BLACK}  # fits a GPU or not; not vermillion: that is the activations' colour
