/* tui.h - the two entry points of the ncurses front end, called by the
 * command dispatcher (cli/main.c). Nothing here needs a terminal header, so
 * the dispatcher can name them without pulling curses into cli/. */
#ifndef KV_TUI_H
#define KV_TUI_H

/* The ncurses application: kvtop [PROFILE] [--set k=v ...] [--frames N]. */
int cmd_tui(int argc, char **argv);
/* The TUI on remote servers: kvtop attach URL [URL ...] [--api-key KEY] ... */
int cmd_attach(int argc, char **argv);
/* Steps through a recorded trace (kvtop replay TRACE [--export OUT]). */
int cmd_replay(int argc, char **argv);
/* The guided demo: comparisons side by side, one station at a time
 * (kvtop tour [--station N] [--frames N] [--list]). */
int cmd_tour(int argc, char **argv);

/* The server `kvtop PROFILE --serve PORT` runs on the TUI's engine, as
 * server/'s table of calls: the dispatcher hands it over before cmd_tui, so
 * tui/ links no server code. Without it --serve is refused. */
struct kv_server_ops;
void cmd_tui_set_server(const struct kv_server_ops *ops);

#endif
