package cli

import (
	"fmt"
	"runtime"
	"sort"
	"strings"

	"github.com/runfleet/runfleet/shared/version"
)

func completionCmd() *command {
	return &command{
		name: "completion", summary: "Print a shell completion script: bash, zsh or fish",
		args: "SHELL", minArgs: 1, maxArgs: 1, argValues: []string{"bash", "zsh", "fish"}, local: true,
		long: "The script completes commands, subcommands and flags (and the values of flags that take one\n" +
			"of a few); it calls nothing at completion time.",
		examples: []string{
			"# bash: for this shell, then for every new one",
			"source <(runfleet completion bash)",
			"runfleet completion bash > ~/.local/share/bash-completion/completions/runfleet",
			"# zsh: into a directory of your $fpath",
			"runfleet completion zsh > \"${fpath[1]}/_runfleet\"",
			"runfleet completion fish > ~/.config/fish/completions/runfleet.fish",
		},
		setup: func(fs *flagSet) func(*invocation) int {
			return func(inv *invocation) int {
				spec := specOf(root())
				var script string
				switch inv.args[0] {
				case "bash":
					script = spec.bash()
				case "zsh":
					script = spec.zsh()
				default:
					script = spec.fish()
				}
				fmt.Fprint(inv.ui.out, script)
				return ExitOK
			}
		},
	}
}

func versionCmd() *command {
	return &command{
		name: "version", summary: "Print runfleet's version", local: true,
		examples: []string{"runfleet version"},
		setup: func(fs *flagSet) func(*invocation) int {
			return func(inv *invocation) int {
				fmt.Fprintf(inv.ui.out, "runfleet %s (%s, %s/%s)\n", version.Version, runtime.Version(), runtime.GOOS, runtime.GOARCH)
				return ExitOK
			}
		},
	}
}

// nodeSpec is one command as completion sees it: key names it in the
// scripts ("root", "runs_list").
type nodeSpec struct {
	key, name, summary string
	subs               []*nodeSpec
	names              []string // the subs' names
	flags              []flagSpec
	argValues          []string
}

type flagSpec struct {
	name, usage string
	takesValue  bool
	values      []string
}

type completionSpec struct {
	nodes []*nodeSpec // every node, the root first
}

func specOf(r *command) completionSpec {
	var spec completionSpec
	var walk func(c *command, key string) *nodeSpec
	walk = func(c *command, key string) *nodeSpec {
		n := &nodeSpec{key: key, name: c.name, summary: c.summary, argValues: c.argValues}
		spec.nodes = append(spec.nodes, n)
		for _, s := range c.subs {
			k := s.name
			if key != "root" {
				k = key + "_" + s.name
			}
			n.subs = append(n.subs, walk(s, k))
			n.names = append(n.names, s.name)
		}
		if c.setup != nil {
			fs := newFlagSet(key)
			c.setup(fs)
			if !c.local {
				addGlobalFlags(fs)
			}
			for _, name := range fs.order {
				m := fs.meta[name]
				n.flags = append(n.flags, flagSpec{name: name, usage: fs.fs.Lookup(name).Usage, takesValue: m.placeholder != "", values: m.values})
			}
		}
		n.flags = append(n.flags, flagSpec{name: "help", usage: "show help"})
		return n
	}
	walk(r, "root")
	return spec
}

func (n *nodeSpec) flagNames(valuedOnly bool) []string {
	var out []string
	for _, f := range n.flags {
		if !valuedOnly || f.takesValue {
			out = append(out, "--"+f.name)
		}
	}
	return out
}

// bash is a script for bash-completion (or plain `complete`): it walks
// the words typed to find the command, skipping flags and their values.
func (s completionSpec) bash() string {
	var b strings.Builder
	b.WriteString("# bash completion for runfleet (runfleet completion bash); generated, do not edit\n")
	caseFn := func(name string, body func(n *nodeSpec) string) {
		fmt.Fprintf(&b, "%s() {\n  case \"$1\" in\n", name)
		for _, n := range s.nodes {
			if v := body(n); v != "" {
				fmt.Fprintf(&b, "    %s) echo %q ;;\n", n.key, v)
			}
		}
		b.WriteString("  esac\n}\n")
	}
	caseFn("_runfleet_subs", func(n *nodeSpec) string { return strings.Join(n.names, " ") })
	caseFn("_runfleet_flags", func(n *nodeSpec) string { return strings.Join(n.flagNames(false), " ") })
	caseFn("_runfleet_valued", func(n *nodeSpec) string { return strings.Join(n.flagNames(true), " ") })
	caseFn("_runfleet_args", func(n *nodeSpec) string { return strings.Join(n.argValues, " ") })
	b.WriteString("_runfleet_values() {\n  case \"$1 $2\" in\n")
	for _, n := range s.nodes {
		for _, f := range n.flags {
			if len(f.values) > 0 {
				fmt.Fprintf(&b, "    %q) echo %q ;;\n", n.key+" --"+f.name, strings.Join(f.values, " "))
			}
		}
	}
	b.WriteString("  esac\n}\n")
	b.WriteString(`_runfleet() {
  local cur="${COMP_WORDS[COMP_CWORD]}" key=root w i skip=0 flag=""
  for ((i = 1; i < COMP_CWORD; i++)); do
    w="${COMP_WORDS[i]}"
    if [[ $skip == 1 ]]; then skip=0; continue; fi
    case "$w" in
      --) COMPREPLY=(); return 0 ;;
      --*=*) ;;
      -*)
        if [[ " $(_runfleet_valued "$key") " == *" $w "* ]]; then skip=1; flag="$w"; fi ;;
      *)
        if [[ " $(_runfleet_subs "$key") " == *" $w "* ]]; then
          if [[ $key == root ]]; then key="$w"; else key="${key}_$w"; fi
        fi ;;
    esac
  done
  if [[ $skip == 1 ]]; then
    COMPREPLY=($(compgen -W "$(_runfleet_values "$key" "$flag")" -- "$cur"))
    return 0
  fi
  if [[ $cur == -* ]]; then
    COMPREPLY=($(compgen -W "$(_runfleet_flags "$key")" -- "$cur"))
  else
    COMPREPLY=($(compgen -W "$(_runfleet_subs "$key") $(_runfleet_args "$key")" -- "$cur"))
  fi
}
complete -F _runfleet runfleet
`)
	return b.String()
}

// zsh is a script for zsh's completion system (a #compdef file): the
// same walk, with each command's and flag's description.
func (s completionSpec) zsh() string {
	var b strings.Builder
	b.WriteString("#compdef runfleet\n# zsh completion for runfleet (runfleet completion zsh); generated, do not edit\n")
	b.WriteString("_runfleet_subs() {\n  case $1 in\n")
	for _, n := range s.nodes {
		if len(n.subs) == 0 {
			continue
		}
		fmt.Fprintf(&b, "    %s) reply=(", n.key)
		for _, sub := range n.subs {
			fmt.Fprintf(&b, " %s", zshQuote(sub.name+":"+sub.summary))
		}
		b.WriteString(" ) ;;\n")
	}
	b.WriteString("    *) reply=() ;;\n  esac\n}\n")
	b.WriteString("_runfleet_flags() {\n  case $1 in\n")
	for _, n := range s.nodes {
		fmt.Fprintf(&b, "    %s) reply=(", n.key)
		for _, f := range n.flags {
			fmt.Fprintf(&b, " %s", zshQuote("--"+f.name+":"+f.usage))
		}
		b.WriteString(" ) ;;\n")
	}
	b.WriteString("    *) reply=() ;;\n  esac\n}\n")
	b.WriteString("_runfleet_valued() {\n  case $1 in\n")
	for _, n := range s.nodes {
		if v := n.flagNames(true); len(v) > 0 {
			fmt.Fprintf(&b, "    %s) reply=(%s) ;;\n", n.key, strings.Join(v, " "))
		}
	}
	b.WriteString("    *) reply=() ;;\n  esac\n}\n")
	b.WriteString("_runfleet_values() {\n  case \"$1 $2\" in\n")
	for _, n := range s.nodes {
		for _, f := range n.flags {
			if len(f.values) > 0 {
				fmt.Fprintf(&b, "    %s) reply=(%s) ;;\n", zshQuote(n.key+" --"+f.name), strings.Join(f.values, " "))
			}
		}
		if len(n.argValues) > 0 {
			fmt.Fprintf(&b, "    %s) reply=(%s) ;;\n", zshQuote(n.key+" "), strings.Join(n.argValues, " "))
		}
	}
	b.WriteString("    *) reply=() ;;\n  esac\n}\n")
	b.WriteString(`_runfleet() {
  local key=root w i skip=0 flag=""
  local -a reply subs
  for ((i = 2; i < CURRENT; i++)); do
    w=${words[i]}
    if (( skip )); then skip=0; continue; fi
    case $w in
      --) return 1 ;;
      --*=*) ;;
      -*)
        _runfleet_valued $key
        if (( ${reply[(Ie)$w]} )); then skip=1; flag=$w; fi ;;
      *)
        _runfleet_subs $key
        if (( ${reply[(I)${w}:*]} )); then
          if [[ $key == root ]]; then key=$w; else key=${key}_$w; fi
        fi ;;
    esac
  done
  if (( skip )); then
    _runfleet_values $key $flag
    compadd -a reply
    return
  fi
  if [[ ${words[CURRENT]} == -* ]]; then
    _runfleet_flags $key
    _describe -t flags 'flag' reply
    return
  fi
  _runfleet_subs $key
  subs=("${reply[@]}")
  if (( ${#subs} )); then
    _describe -t commands 'command' subs
    return
  fi
  _runfleet_values $key ''
  (( ${#reply} )) && compadd -a reply
}
if [[ $zsh_eval_context[-1] == loadautofunc ]]; then
  _runfleet "$@"
else
  compdef _runfleet runfleet
fi
`)
	return b.String()
}

// zshQuote single-quotes s for zsh, colons in a description escaped as
// _describe wants (the first colon separates the name).
func zshQuote(s string) string {
	name, desc, ok := strings.Cut(s, ":")
	if ok {
		s = name + ":" + strings.ReplaceAll(desc, ":", `\:`)
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// fish is a script of `complete` lines, each under a condition on the
// command typed so far (a helper walks the words as bash's does).
func (s completionSpec) fish() string {
	var b strings.Builder
	b.WriteString("# fish completion for runfleet (runfleet completion fish); generated, do not edit\n")
	b.WriteString("function __runfleet_key\n  set -l key root\n  set -l skip 0\n  set -l words (commandline -opc)\n")
	b.WriteString("  for w in $words[2..-1]\n    if test $skip = 1\n      set skip 0\n      continue\n    end\n")
	b.WriteString("    switch $w\n      case '--'\n        echo none\n        return\n      case '--*=*'\n")
	// Which flags take a value, per key.
	b.WriteString("      case '-*'\n        if contains -- $w (__runfleet_valued $key)\n          set skip 1\n        end\n")
	b.WriteString("      case '*'\n        if contains -- $w (__runfleet_subs $key)\n          if test $key = root\n            set key $w\n          else\n            set key $key\"_\"$w\n          end\n        end\n    end\n  end\n  echo $key\nend\n")
	fishCase := func(name string, body func(n *nodeSpec) []string) {
		fmt.Fprintf(&b, "function %s\n  switch $argv[1]\n", name)
		keys := make([]string, 0, len(s.nodes))
		byKey := map[string]*nodeSpec{}
		for _, n := range s.nodes {
			keys = append(keys, n.key)
			byKey[n.key] = n
		}
		sort.Strings(keys)
		for _, k := range keys {
			if v := body(byKey[k]); len(v) > 0 {
				fmt.Fprintf(&b, "    case %s\n      printf '%%s\\n' %s\n", k, strings.Join(v, " "))
			}
		}
		b.WriteString("  end\nend\n")
	}
	fishCase("__runfleet_subs", func(n *nodeSpec) []string { return n.names })
	fishCase("__runfleet_valued", func(n *nodeSpec) []string { return n.flagNames(true) })
	b.WriteString("complete -c runfleet -f\n")
	for _, n := range s.nodes {
		cond := fmt.Sprintf("-n 'test (__runfleet_key) = %s'", n.key)
		for _, sub := range n.subs {
			fmt.Fprintf(&b, "complete -c runfleet %s -a %s -d %s\n", cond, sub.name, fishQuote(sub.summary))
		}
		if len(n.argValues) > 0 {
			fmt.Fprintf(&b, "complete -c runfleet %s -a %s\n", cond, fishQuote(strings.Join(n.argValues, " ")))
		}
		for _, f := range n.flags {
			line := fmt.Sprintf("complete -c runfleet %s -l %s -d %s", cond, f.name, fishQuote(f.usage))
			if f.takesValue {
				line += " -x"
				if len(f.values) > 0 {
					line += " -a " + fishQuote(strings.Join(f.values, " "))
				}
			}
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}

func fishQuote(s string) string {
	return "'" + strings.ReplaceAll(strings.ReplaceAll(s, `\`, `\\`), "'", `\'`) + "'"
}
