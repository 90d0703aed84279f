"""Every figure the notebooks show, as functions of their tidy tables: a matplotlib Figure whose title names
what is plotted and whose subtitle says where the numbers come from (simulated, measured or synthetic, and
the scale). style holds the colours, labels, titles and saving (PNG + SVG: `save_figure`); one module per
notebook group: tutorial (00) and its widgets, routing (01), throughput (02-06), overheads (07), runtime (08,
09), sensitivity (10), scale (11), claim_map (12).
"""

from relibra.plots.overheads import overhead_bars, planner_time_plot, policy_summary_plot
from relibra.plots.routing import expert_load_heatmaps, prediction_error_plot, shift_bars, static_skewness_plot
from relibra.plots.runtime import reward_plot, runtime_rank_plot, runtime_speedup_plot, runtime_step_segments_plot
from relibra.plots.scale import cluster_label, ep_sweep_plot, ratio_pivot, scale_planner_plot
from relibra.plots.sensitivity import tornado_plot
from relibra.plots.style import save_figure, set_style
from relibra.plots.throughput import (ablation_plot, fraction_of_balanced, reorder_plot, replication_plot,
                                      skewness_plot, spare_slot_plot, throughput_bars)
from relibra.plots.tutorial import (phase_figure, plan_figure, replay_figure, skew_sweep_figure, tutorial_figure,
                                    tutorial_grid_figure)
from relibra.plots.claim_map import verdict_map_plot
from relibra.plots.widgets import tutorial_interactive

