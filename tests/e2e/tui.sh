#!/usr/bin/env bash
# End-to-end checks of the ncurses app driven through tmux at 120x40 on
# stories260K: replies in two tabs, the panels, pause and single-step with
# two owners in the block map, resize to 80x24 / too small / back, the help
# overlay, quitting with q and Ctrl-C restoring the terminal, --frames,
# autosave, and a recorded trace replayed and exported as Chrome JSON: one
# frame per engine step (the replay's N is the steps the engine made while
# recording, counted by the step counter with the engine idle or paused at
# both ends), each step exported once.
# Prints "N passed, N failed".
set -u
TMUX_NAME=kvtop-e2e
. "$(dirname "$0")/lib/tmux.sh"
M=$S/models/stories260K.gguf
step_no() { cap | head -n 1 | grep -o 'step [0-9]*' | grep -o '[0-9]*'; }
# The block map's grid rows: the KV panel's lines made only of map glyphs.
grid() { cap | sed -n '2,16p' | sed 's/^.*││//; s/│$//' | grep -E '^[.:a-zA-Z0-9]+ *$'; }

# Greedy sampling so the replies are the model's reference text.
tm new-session -d -s $s -x 120 -y 40 \
  "env XDG_STATE_HOME=$tmp/state $K profiles/default.yaml --set model.path=$M --set sampling.temperature=0 --set kv.blocks=600 --set kv.memory=0; echo EXITED rc=\$?; sleep 60"
if wait_for 'step [0-9]+' 10; then ok "starts and loads stories260K"; else bad "starts and loads stories260K" "$(cap)"; fi

# Record a trace of everything that follows. The engine is idle: its step
# counter stands still until the first prompt.
tm send-keys -t $s F7
wait_for 'REC' 3 && ok "F7 starts recording" || bad "F7 starts recording" "$(cap)"
rec0=$(step_no)

tm send-keys -t $s "Once upon a time" Enter
if wait_for 'little girl named' 8; then ok "reply streams into tab 1"; else bad "reply streams into tab 1" "$(cap)"; fi
# Let it finish (256 tokens) so tab 1 is free again.
wait_for 'finish #1' 20 || bad "first reply finishes" "$(cap)"
a=$(cap)
miss=""
for w in "KV blocks" "Prefix sharing" "Spec decoding" "TPOT" "Mem" "Sched" "Step log"; do
  [[ $a == *"$w"* ]] || miss+=" '$w'"
done
[[ -z $miss ]] && ok "all panels on screen at 120x40" || bad "panels missing:$miss" "$a"
[[ $a == *"admit #"* && $a == *"finish #"* ]] && ok "step log shows admit and finish" || bad "step log" "$a"
[[ $a == *"off"* ]] && ok "spec panel says off" || bad "spec panel says off" "$a"

# Pause, then queue a prompt in a new tab and in tab 1: nothing runs until a step.
tm send-keys -t $s F2
wait_for 'PAUSED' 3 && ok "F2 pauses" || bad "F2 pauses" "$(cap)"
tm send-keys -t $s "/new" Enter
wait_for '2:b chat-2' 3 && ok "/new opens tab 2" || bad "/new opens tab 2" "$(cap)"
tm send-keys -t $s "Tom and Lily went to the park" Enter
sleep 0.3
tm send-keys -t $s M-1
wait_for 'Chat a chat-1' 3 || bad "Alt-1 back to tab 1" "$(cap)"
tm send-keys -t $s "The dog ran" Enter
sleep 0.5
n0=$(step_no)
sleep 0.5
n1=$(step_no)
[[ -n $n0 && $n0 == "$n1" ]] && ok "paused: the step counter stands still ($n0)" || bad "paused: step counter moved ($n0 -> $n1)" "$(cap)"
tm send-keys -t $s F3
sleep 0.6
n2=$(step_no)
[[ -n $n2 && $n2 == $((n0 + 1)) ]] && ok "F3 single-steps ($n0 -> $n2)" || bad "F3 single-steps ($n0 -> $n2)" "$(cap)"
tm send-keys -t $s F3
sleep 0.6
n3=$(step_no)
[[ -n $n3 && $n3 == $((n0 + 2)) ]] && ok "second step ($n3)" || bad "second step ($n0 -> $n3)" "$(cap)"
g=$(grid)
if [[ $g == *[aA]* && $g == *[bB]* ]] && cap | grep -q 'owners 2'; then
  ok "two owners in the block map"
else
  bad "two owners in the block map" "$(cap)"
fi
cap | grep -q '#[0-9]* a table: ' && ok "block table chain of tab 1" || bad "block table chain of tab 1" "$(cap)"

# Resume: both replies finish, counters move.
tm send-keys -t $s F2
wait_for 'engine running' 3 || true
sleep 1.5
n4=$(step_no)
[[ -n $n4 && $n4 -gt $((n3 + 10)) ]] && ok "resumed: counters move ($n3 -> $n4)" || bad "resumed: counters move ($n3 -> $n4)" "$(cap)"
cap | grep -q 'you  The dog ran' && ok "tab 1 transcript has the second prompt" || bad "tab 1 transcript" "$(cap)"
tm send-keys -t $s M-2
if wait_for 'you  Tom and Lily went to the park' 3 && cap | grep -A3 'you  Tom and Lily' | grep -q '^│bot '; then
  ok "tab 2 has its own transcript and reply"
else
  bad "tab 2 has its own transcript and reply" "$(cap)"
fi

# Slow motion, then Esc cancels the reply in flight; per-tab settings; rename.
tm send-keys -t $s "/slow 100" Enter
wait_for 'slow motion: 100 ms per step' 3 && ok "/slow sets slow motion" || bad "/slow" "$(cap)"
tm send-keys -t $s "One day" Enter
sleep 1
tm send-keys -t $s Escape
wait_for '\[cancelled\]' 3 && ok "Esc cancels the reply in flight" || bad "Esc cancels the reply in flight" "$(cap)"
tm send-keys -t $s "/slow 0" Enter "/temp 0.5" Enter
wait_for 'temperature 0.50' 3 && ok "/temp changes this tab's sampling" || bad "/temp" "$(cap)"
tm send-keys -t $s "/rename stories" Enter
wait_for '2:b stories' 3 && ok "/rename" || bad "/rename" "$(cap)"
tm send-keys -t $s "/temp hot" Enter
wait_for '/temp needs a temperature' 3 && ok "bad command: an error on the status line" || bad "bad command" "$(cap)"

# Help overlay, zoom.
tm send-keys -t $s F1
wait_for 'any key closes' 3 && ok "F1 help overlay" || bad "F1 help overlay" "$(cap)"
tm send-keys -t $s x
sleep 0.3
cap | grep -q 'any key closes' && bad "help closes on a key" "$(cap)" || ok "help closes on a key"
tm send-keys -t $s F6
sleep 0.4
z=$(cap)
[[ $z == *"KV blocks"* && $z != *"Prefix sharing"* ]] && ok "F6 zooms the block map" || bad "F6 zooms the block map" "$z"
tm send-keys -t $s Escape
sleep 0.4
cap | grep -q 'Prefix sharing' && ok "Esc unzooms" || bad "Esc unzooms" "$(cap)"

# Resize: 80x24 keeps the main panels, smaller shows a message, back again.
# resize_to W H: the session's window to W x H, then a moment to redraw.
resize_to() { tm resize-window -t $s -x "$1" -y "$2"; sleep 0.6; }
resize_to 80 24
r=$(cap)
[[ $r == *"KV blocks"* && $r == *"Chat"* && $r == *"Sched"* ]] && ok "80x24 layout" || bad "80x24 layout" "$r"
resize_to 70 20
cap | grep -q 'needs at least 80x24' && ok "too small: a clear message" || bad "too small: a clear message" "$(cap)"
resize_to 120 40
r=$(cap)
[[ $r == *"TPOT"* && $r == *"Mem"* && $r == *"Prefix"* ]] && ok "back to 120x40" || bad "back to 120x40" "$r"

# Background load from the profile's workload: 'w' blocks appear; the UI
# stays cheap (its own CPU time is on the status line).
tm send-keys -t $s F5
if wait_for 'LOAD' 3 && wait_for 'w load' 8; then ok "F5 injects background load"; else bad "F5 injects background load" "$(cap)"; fi
sleep 2.5
cpu=$(cap | tail -n 1 | grep -o 'ui [0-9.]*% cpu' | grep -o '[0-9.]*' | head -n 1)
[[ -n $cpu ]] && awk -v c="$cpu" 'BEGIN { exit !(c < 5.0) }' && ok "UI thread under 5% of a core at 10 fps ($cpu%)" ||
  bad "UI CPU ($cpu%)" "$(cap)"
tm send-keys -t $s F5
wait_for 'load stopped' 3 && ok "F5 stops the load" || bad "F5 stops the load" "$(cap)"

# Multi-line input: Alt-Enter breaks the line; Ctrl-A Ctrl-K clears it all.
tm send-keys -t $s "first line" M-Enter "second line"
if wait_for '^│> first line' 3 && cap | grep -q '^│  second line'; then ok "Alt-Enter: multi-line input"; else bad "multi-line input" "$(cap)"; fi
tm send-keys -t $s C-a C-k
sleep 0.3

# Stop recording (the status line names the file and the steps recorded)
# with the engine paused, so the step counter is the last step recorded;
# then quit with q from the panels.
tm send-keys -t $s F2
wait_for 'PAUSED' 3 || bad "F2 pauses before the recording stops" "$(cap)"
sleep 0.5
rec1=$(step_no)
sleep 0.3
[[ -n $rec1 && $rec1 == "$(step_no)" ]] || bad "paused: step counter stands still ($rec1)" "$(cap)"
tm send-keys -t $s F7
wait_for 'trace saved' 3 && ok "F7 stops recording" || bad "F7 stops recording" "$(cap)"
nrec=$(cap | grep -o 'kvtrace ([0-9]* steps' | grep -o '[0-9]*' | tail -n 1)
if [[ -n $rec0 && -n $rec1 && -n $nrec && $nrec -gt 100 && $nrec == $((rec1 - rec0)) ]]; then
  ok "every engine step recorded ($nrec = steps $rec0..$rec1)"
else
  bad "every engine step recorded ($nrec steps, counter $rec0 -> $rec1)" "$(cap)"
fi
tm send-keys -t $s Tab
sleep 0.2
tm send-keys -t $s q
if wait_for 'EXITED rc=0' 5; then
  e=$(cap)
  [[ $e != *"KV blocks"* ]] && ok "q exits and restores the terminal" || bad "terminal not restored" "$e"
else
  bad "q exits" "$(cap)"
fi

# Autosave: every prompt and reply is on disk.
saved=$(cat "$tmp"/state/kvtop/*.md 2>/dev/null)
[[ $saved == *"Once upon a time"* && $saved == *"little girl named"* && $saved == *"Tom and Lily went to the park"* ]] &&
  ok "transcripts autosaved under \$XDG_STATE_HOME/kvtop" || bad "autosave" "$saved"

# The trace: export as Chrome JSON, and step through it in the viewer.
tr=$(ls "$tmp"/state/kvtop/*.kvtrace 2>/dev/null | head -n 1)
# Each step once: the first frame also carries the (at most 256) step
# records the engine held when the recording began.
if [[ -n $tr ]] && $K replay "$tr" --export "$tmp/t.json" >/dev/null 2>&1 &&
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); e=d["traceEvents"]; s=[x["name"] for x in e if x.get("cat")=="step"]; r=[x for x in e if x.get("cat")=="request"]; n=int(sys.argv[2]); r0=int(sys.argv[3]); sys.exit(0 if len(s)==len(set(s))==n+min(r0,256) and r else 1)' "$tmp/t.json" "${nrec:-0}" "${rec0:-0}"; then
  ok "trace exported as Chrome trace JSON, each step once"
else
  bad "trace export" "$(ls -la "$tmp"/state/kvtop/ 2>&1)"
fi
# A recording cut off mid-frame (as SIGKILL leaves it) still exports its
# complete frames, and the command says how the file ends.
if [[ -n $tr ]]; then
  sz=$(stat -c %s "$tr"); head -c $((sz - 7)) "$tr" >"$tmp/cut.kvtrace"
  out=$($K replay "$tmp/cut.kvtrace" --export "$tmp/cut.json" 2>&1); rc=$?
  [[ $rc == 0 && $out == *"ends mid-frame"* && -s $tmp/cut.json ]] && ok "a cut recording exports and says where it ends" ||
    bad "cut recording (rc $rc)" "$out"
fi
if [[ -n $tr ]]; then
  tm new-session -d -s $s-b -x 120 -y 40 "$K replay $tr; echo EXITED rc=\$?; sleep 30"
  # Frame i is step rec0 + i: the first, the next, back, and the last.
  if wait_for "REPLAY 1/$nrec .*step $((rec0 + 1))( |$)" 5 $s-b; then
    tm send-keys -t $s-b Right
    if wait_for "REPLAY 2/$nrec .*step $((rec0 + 2))( |$)" 3 $s-b; then
      tm send-keys -t $s-b Left
      wait_for 'REPLAY 1/' 3 $s-b && ok "replay steps forward and back" || bad "replay steps back" "$(cap $s-b)"
    else
      bad "replay steps forward" "$(cap $s-b)"
    fi
    tm send-keys -t $s-b End
    wait_for "REPLAY $nrec/$nrec .*step $rec1( |$)" 3 $s-b && ok "replay ends at the last step recorded ($rec1)" ||
      bad "replay ends at step $rec1" "$(cap $s-b)"
  else
    bad "replay opens at step $((rec0 + 1)) of $nrec" "$(cap $s-b)"
  fi
  tm send-keys -t $s-b q
  wait_for 'EXITED rc=0' 3 $s-b && ok "replay quits with q" || bad "replay quits with q" "$(cap $s-b)"
  tm kill-session -t $s-b 2>/dev/null
fi

# A trace that cannot be written: the recording stops with the error on the
# status line, and the app goes on.
tm kill-session -t $s 2>/dev/null
tm new-session -d -s $s -x 120 -y 40 \
  "$K profiles/default.yaml --set model.path=$M --set kv.blocks=600 --set kv.memory=0 --record /dev/full; echo EXITED rc=\$?; sleep 30"
wait_for 'step [0-9]+' 8 || true
tm send-keys -t $s "Once upon a time" Enter
if wait_for 'trace /dev/full: write error after [0-9]+ steps, recording stopped' 8 && ! cap | head -n 1 | grep -q 'REC'; then
  ok "a write error stops the recording"
else
  bad "a write error stops the recording" "$(cap)"
fi
wait_for 'little girl named' 8 && ok "the reply goes on without the trace" || bad "reply after a write error" "$(cap)"
tm send-keys -t $s C-c
wait_for 'EXITED rc=0' 5 || bad "quit after a write error" "$(cap)"

# --frames N exits by itself; Ctrl-C quits; bad options fail before curses.
tm kill-session -t $s 2>/dev/null
tm new-session -d -s $s -x 100 -y 30 "$K profiles/default.yaml --set model.path=$M --frames 8; echo EXITED rc=\$?; sleep 30"
wait_for 'EXITED rc=0' 6 && ok "--frames 8 exits by itself" || bad "--frames 8 exits by itself" "$(cap)"
tm kill-session -t $s 2>/dev/null
tm new-session -d -s $s -x 100 -y 30 "$K profiles/default.yaml --set model.path=$M; echo EXITED rc=\$?; sleep 30"
wait_for 'step [0-9]+' 8 || true
tm send-keys -t $s C-c
wait_for 'EXITED rc=0' 5 && ok "Ctrl-C exits" || bad "Ctrl-C exits" "$(cap)"
tm kill-session -t $s 2>/dev/null
# NO_COLOR: no color escape sequences at all; a model that fails to load is explained, not fatal.
tm new-session -d -s $s -x 100 -y 30 "NO_COLOR=1 $K profiles/default.yaml --set model.path=$tmp/missing.gguf; echo EXITED rc=\$?; sleep 30"
if wait_for 'missing.gguf' 6; then
  tm capture-pane -e -p -t $s | grep -q $'\e\[3[0-7]m' && bad "NO_COLOR still colors" || ok "NO_COLOR: monochrome"
  ok "a model that fails to load is reported on screen"
  tm send-keys -t $s C-c
  wait_for 'EXITED rc=0' 5 || bad "quit after a failed load" "$(cap)"
else
  bad "a model that fails to load is reported on screen" "$(cap)"
fi
out=$($K profiles/default.yaml --set kv.block_size=0 2>&1 </dev/null); rc=$?
[[ $rc == 2 && $out == *"kv.block_size"* ]] && ok "bad --set: error before the screen opens" || bad "bad --set" "$out"
out=$($K profiles/default.yaml --frames 1 2>&1 </dev/null); rc=$?
[[ $rc == 1 && $out == *"needs a terminal"* ]] && ok "no terminal: clear error" || bad "no terminal" "$out"
finish
