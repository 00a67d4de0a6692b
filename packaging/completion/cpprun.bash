# bash completion for cpprun. Options come from `cpprun --help` (so they never drift from the
# binary), values for the options that take a fixed set, files and programs elsewhere. After
# the entry point every word belongs to the workers: files only. The lists of flags (options
# without a value) and of short options with a value are checked against cpprun's option table
# by tests/launcher/cli_test.cc.
_cpprun() {
  local cur prev words cword
  if declare -F _init_completion >/dev/null; then
    _init_completion -n = || return
  else
    cur=${COMP_WORDS[COMP_CWORD]}
    prev=${COMP_WORDS[COMP_CWORD - 1]}
    words=("${COMP_WORDS[@]}")
    cword=$COMP_CWORD
  fi

  # Past the entry point (the first word that is not an option or an option's value)?
  local i takes_value
  for ((i = 1; i < cword; i++)); do
    case ${words[i]} in
      --) COMPREPLY=($(compgen -f -- "$cur")); return ;;
      --*=* | -m | --module | --no-python | --standalone | --dry-run | --check | \
        --worker-hosts-store | --virtual-local-rank | --run-path | --strict-numa-binding | \
        --raw-output | --warm-restart) ;;
      -r | -t) takes_value=1 ;;
      -*) [[ ${words[i]} == --* ]] && takes_value=1 ;;
      *)
        if [[ -n $takes_value ]]; then
          takes_value=
        else
          COMPREPLY=($(compgen -f -- "$cur"))
          return
        fi
        ;;
    esac
  done

  local value_of=$prev
  if [[ $cur == --*=* ]]; then
    value_of=${cur%%=*}
    cur=${cur#*=}
  fi
  case $value_of in
    --nproc-per-node | --nproc_per_node)
      COMPREPLY=($(compgen -W "gpu cpu auto 1 2 4 8" -- "$cur")); return ;;
    --rdzv-backend | --rdzv_backend)
      COMPREPLY=($(compgen -W "static c10d etcd etcd-v2" -- "$cur")); return ;;
    --start-method | --start_method)
      COMPREPLY=($(compgen -W "spawn fork forkserver" -- "$cur")); return ;;
    --numa-binding | --numa_binding)
      COMPREPLY=($(compgen -W "node socket exclusive core-complex" -- "$cur")); return ;;
    -r | --redirects | -t | --tee)
      COMPREPLY=($(compgen -W "0 1 2 3" -- "$cur")); return ;;
    --signals-to-handle | --signals_to_handle)
      COMPREPLY=($(compgen -W "SIGTERM,SIGINT,SIGHUP,SIGQUIT SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1" -- "$cur")); return ;;
    --log-dir | --log_dir)
      COMPREPLY=($(compgen -d -- "$cur")); return ;;
    --nnodes | --node-rank | --node_rank | --master-addr | --master_addr | --master-port | \
      --master_port | --rdzv-endpoint | --rdzv_endpoint | --rdzv-id | --rdzv_id | --rdzv-conf | \
      --rdzv_conf | --max-restarts | --max_restarts | --monitor-interval | --monitor_interval | \
      --shutdown-timeout | --shutdown_timeout | --local-addr | --local_addr | --role | \
      --local-ranks-filter | --local_ranks_filter)
      return ;;  # free values
  esac

  if [[ $cur == -* ]]; then
    local options
    options=$("${words[0]}" --help 2>/dev/null | grep -oE -- '(^|[ ,])--?[a-zA-Z][a-zA-Z-]*' |
      sed 's/^[ ,]*//' | sort -u)
    COMPREPLY=($(compgen -W "$options" -- "$cur"))
    return
  fi
  COMPREPLY=($(compgen -f -- "$cur"))
}
complete -o default -F _cpprun cpprun
