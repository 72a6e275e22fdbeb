/* compare.h - the side-by-side screen's entry points inside tui/: `kvtop
 * PROFILE --compare key=v1,v2[,v3,v4]` (cmd_tui hands over to cmp_main)
 * and the guided tour (`kvtop tour`, tour.c), whose stations are
 * comparisons of their own. Private to tui/. */
#ifndef KV_TUI_COMPARE_H
#define KV_TUI_COMPARE_H

#include "app_internal.h"

/* One station of the tour: a profile, the comparison that runs on it and
 * what to watch, in a line. */
typedef struct kv_tour_station {
    const char *title;   /* "paging" */
    const char *profile; /* profiles/demo-paging.yaml */
    const char *compare; /* "kv.layout=paged,contiguous" */
    const char *caption; /* one line: what the comparison shows, what to watch */
} kv_tour_station;

/* The tour's stations in order, *n their number (tour.c). */
const kv_tour_station *kv_tour_stations(int *n /* OUT: */);

/* Runs the side-by-side screen on ui (the app struct cmd_tui filled: cfg
 * from the profile, max_frames) for `profile` with sets[0..n_sets) and
 * "key=value" for each value of spec, or, with stations (n_stations > 0),
 * the tour from station `first`. Builds every engine before curses starts:
 * a bad spec or value, or an engine that does not load, is reported on
 * stderr and nothing starts (exit code 2). Returns the process exit code. */
int cmp_main(app *ui, const char *profile, const char *const *sets, int n_sets, const char *spec,
             const kv_tour_station *stations, int n_stations, int first);

#endif
