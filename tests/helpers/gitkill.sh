#!/bin/sh
# A `git` for the interrupt tests, put first on PATH: it counts the git commands of one vpatch process and,
# at the VPATCH_GITKILL_AT-th, acts by VPATCH_GITKILL_MODE:
#   before  - kill vpatch (its parent) with SIGKILL before the command runs, as `kill -9` or a power cut would
#   after   - run the command, then kill vpatch before it can read the result
#   locked  - as after, but a `worktree add` is left locked, the way git leaves one killed mid-checkout
#   hook    - run the command, then the shell command VPATCH_GITKILL_HOOK (e.g. create .git/index.lock); no kill
#   pause   - create the file VPATCH_GITKILL_PAUSE.reached, wait until VPATCH_GITKILL_PAUSE exists, then run
n=$(( $(cat "$VPATCH_GITKILL_COUNTER" 2>/dev/null || echo 0) + 1 ))
echo "$n" > "$VPATCH_GITKILL_COUNTER"
[ -n "$VPATCH_GITKILL_LOG" ] && echo "$n $*" >> "$VPATCH_GITKILL_LOG"
[ "$n" = "${VPATCH_GITKILL_AT:-0}" ] || exec "$VPATCH_REAL_GIT" "$@"
case "$VPATCH_GITKILL_MODE" in
    before)
        kill -9 "$PPID"
        exit 137 ;;
    pause)
        : > "$VPATCH_GITKILL_PAUSE.reached"
        while [ ! -e "$VPATCH_GITKILL_PAUSE" ]; do sleep 0.05; done
        exec "$VPATCH_REAL_GIT" "$@" ;;
esac
"$VPATCH_REAL_GIT" "$@"
rc=$?
case "$VPATCH_GITKILL_MODE" in
    hook)
        sh -c "$VPATCH_GITKILL_HOOK"
        exit $rc ;;
    locked)
        case " $* " in *" worktree add "*)
            eval "dest=\${$(($# - 1))}"  # `worktree add ... DEST COMMIT`
            "$VPATCH_REAL_GIT" worktree lock --reason initializing "$dest" ;;
        esac ;;
esac
kill -9 "$PPID"
exit $rc
