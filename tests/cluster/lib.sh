# Sourced by tests/cluster/build.sh, tests/cluster/build_engines.sh and
# tests/cluster/real/build.sh: the shared Go caches, the build lock, the staging directory and
# stamped binaries renamed into place. The caller sets RECIPE and defines log() first.

CACHE_ROOT="${TIDESHIFT_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tideshift}"

stamp_of() { # name version
  echo "$1 $2 recipe=$RECIPE"
}
stamped() { # stamp-file name version: the file names this version and recipe
  [[ -f "$1" && "$(cat "$1")" == "$(stamp_of "$2" "$3")" ]]
}
is_current() { # dir name version: dir/name is executable and stamped for version
  [[ -x "$1/$2" ]] && stamped "$1/.stamps/$2" "$2" "$3"
}
write_stamp() { # stamp-file name version, written under a temporary name and renamed
  stamp_of "$2" "$3" >"$1.tmp"
  mv -f "$1.tmp" "$1"
}
install_binary() { # dir name version built-file: renamed into place, then stamped
  mkdir -p "$1/.stamps"
  mv -f "$4" "$1/$2"
  write_stamp "$1/.stamps/$2" "$2" "$3"
  log "installed $2 $3"
}

go_env() { # script-name minimum-go: checks go is there; exports the shared caches
  command -v go >/dev/null || {
    echo "$1: 'go' is not on PATH (Go >= $2 is needed)" >&2
    exit 1
  }
  export GOMODCACHE="$CACHE_ROOT/go/mod"
  export GOCACHE="$CACHE_ROOT/go/build"
  export GOTOOLCHAIN=local
  export GOFLAGS="-mod=mod -modcacherw -buildvcs=false"
  export CGO_ENABLED=0
  mkdir -p "$GOMODCACHE" "$GOCACHE"
}

take_lock() { # lock-file: holds it on fd 9 until exit, waiting for another build holding it
  exec 9>"$1"
  if command -v flock >/dev/null && ! flock -n 9; then
    log "another build holds $1; waiting for it"
    flock 9
  fi
}

make_stage_dir() { # parent: sets STAGE_DIR, removed on exit. Call holding the lock: any
  # leftover partial dir is then from an interrupted run.
  rm -rf "$1"/.partial.*
  STAGE_DIR="$(mktemp -d "$1/.partial.XXXXXX")"
  trap 'rm -rf "$STAGE_DIR"' EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
}
