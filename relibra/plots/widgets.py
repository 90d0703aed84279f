"""The tutorial's ipywidgets controls: recompute a plan and redraw it as parameters change."""

from __future__ import annotations

import io

import matplotlib.pyplot as plt

from relibra.plots.tutorial import plan_figure, tutorial_figure


def tutorial_interactive(compute, choices: dict, enabled: bool = True, **params):
    """ipywidgets controls for EP, spare slots, skew, placement, shift and micro-batch that recompute the plan
    with `compute` (tutorial_case) and redraw the tokens-per-GPU and plan figures, after a line of the numbers
    they show; a slider recomputes when released. choices: {"ep", "placement", "spare_slots": the most};
    params: every keyword argument of `compute` (Params.case_args()). Displays the controls once and returns
    None; does nothing when disabled, without ipywidgets, or outside an IPython kernel.
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
        print(f"micro-batch {mb}: rank skewness {s['skewness']:.3f} (max / mean tokens per GPU), slowest GPU "
              f"{s['slowest_gpu_ms']:.3f} ms, balanced {s['balanced_ms']:.3f} ms")
        # interactive mode off: in a kernel every change to a figure under construction draws it, which has left
        # text placed for another layout
        with plt.ioff():
            for draw in (tutorial_figure, plan_figure):
                _display_png(draw(case, mb), display, Image)

    out = widgets.interactive_output(redraw, controls)
    display(widgets.VBox([widgets.HBox(list(controls.values())[:3]), widgets.HBox(list(controls.values())[3:]), out]))
    return None


def _display_png(fig, display, Image) -> None:
    """Show `fig` as PNG bytes and close it, whatever the backend (under Agg plt.show() draws nothing; an open
    figure would be drawn again at the end of the cell)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    plt.close(fig)
    display(Image(data=buf.getvalue(), format="png"))
