/* commands.h - the subcommands of the kvtop binary. Each lives in its own
 * cli/cmd_<name>.c (the TUI and the replay viewer in tui/, see tui/tui.h)
 * and returns the process exit status (0 ok, 1 runtime
 * error, 2 usage error). argv[0] is the subcommand name. */
#ifndef KV_COMMANDS_H
#define KV_COMMANDS_H

int cmd_info(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_mkmodel(int argc, char **argv);
int cmd_bench_kernels(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_keys(int argc, char **argv);

/* The ncurses front end's entry points (cmd_tui, cmd_replay). */
#include "../tui/tui.h"
/* The HTTP front end's entry point (cmd_serve). */
#include "../server/server.h"

#endif
