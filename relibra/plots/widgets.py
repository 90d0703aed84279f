"""The tutorial's ipywidgets controls: recompute a plan and redraw it as parameters change."""

from __future__ import annotations

import io

import matplotlib.pyplot as plt

from relibra.plots.tutorial import plan_figure, tutorial_figure


def tutorial_interactive(compute, choices: dict, enabled: bool = True, **params):
    """ipywidgets controls for EP, spare slots, skew (and placement, shift, micro-batch) that recompute
    the plan with `compute` (tutorial_case) and redraw the tokens-per-GPU and plan figures.

    choices: {"ep": EP sizes, "placement": placements, "spare_slots": the most spare slots}; params: every
    keyword argument of `compute` (the notebook's Params.case_args()).
    Each redraw prints one line (the micro-batch's rank skewness, slowest-GPU and balanced ms, the
    numbers the figures show), then both figures as PNGs; a slider recomputes when it is released.

    Displays the controls once and returns None (so a notebook cell shows them once). Does nothing
    when disabled, when ipywidgets is missing, or when no IPython kernel runs this code.
    """
    if not enabled:
        return None
    try:
        import ipywidgets as widgets  # notebook-only dependencies
        from IPython import get_ipython
        from IPython.display import Image, display
    except ImportError:
        return None
    shell = get_ipython()
    if shell is None or not hasattr(shell, "kernel"):
        return None
    released = {"continuous_update": False}  # a slider recomputes when it is released
    controls = {
        "ep": widgets.Dropdown(options=list(choices["ep"]), value=params["ep"], description="EP"),
        "spare_slots": widgets.IntSlider(value=params["spare_slots"], min=0, max=choices["spare_slots"],
                                         description="spare slots", **released),
        "skew": widgets.FloatSlider(value=params["skew"], min=0.0, max=3.0, step=0.1, description="skew", **released),
        "placement": widgets.Dropdown(options=list(choices["placement"]), value=params["placement"],
                                      description="placement"),
        "shift": widgets.FloatSlider(value=params["shift"], min=0.0, max=1.0, step=0.1, description="shift",
                                     **released),
        "micro_batch": widgets.IntSlider(value=params["micro_batch"], min=0, max=params["micro_batches"] - 1,
                                         description="micro-batch", **released),
    }
    fixed = {k: params[k] for k in ("seed", "tokens_per_gpu", "micro_batches")}

    def redraw(**values):
        case = compute(**values, **fixed)
        mb = values["micro_batch"]
        s = case["summary"].set_index("micro_batch").loc[mb]
        # The numbers the figures show, as text a reader (or a browser test) can read without the image.
        print(f"micro-batch {mb}: rank skewness {s['skewness']:.3f} (max / mean tokens per GPU), slowest GPU "
              f"{s['slowest_gpu_ms']:.3f} ms, balanced {s['balanced_ms']:.3f} ms")
        # Built with interactive mode off: in a kernel pyplot is interactive, and every change to a figure
        # under construction then draws it, which has left figures with text placed for another layout.
        with plt.ioff():
            for draw in (tutorial_figure, plan_figure):
                _display_png(draw(case, mb), display, Image)

    out = widgets.interactive_output(redraw, controls)
    display(widgets.VBox([widgets.HBox(list(controls.values())[:3]), widgets.HBox(list(controls.values())[3:]), out]))
    return None


def _display_png(fig, display, Image) -> None:
    """Show `fig` as PNG bytes and close it. Independent of matplotlib's backend: under MPLBACKEND=Agg
    plt.show() draws nothing in the output area, and an open figure would be drawn a second time by the
    inline backend at the end of the cell."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    plt.close(fig)
    display(Image(data=buf.getvalue(), format="png"))
