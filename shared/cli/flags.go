package cli

import (
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// flagSet is a small layer over the standard flag package: the flags are
// flag.Values in a flag.FlagSet, but parse reads them wherever they stand
// among the positionals (`runfleet runs get RUN --json`), spelled --name,
// --name=value or --name value, until "--"; a list flag may be repeated;
// -h and --help ask for help. An unknown flag is a usage error naming it.
type flagSet struct {
	path  string
	fs    *flag.FlagSet
	meta  map[string]flagMeta
	order []string
}

// flagMeta is what help and completion say of a flag.
type flagMeta struct {
	placeholder string   // VALUE in --name VALUE; "" for a bool
	values      []string // the values completion offers, when fixed
	repeat      bool
}

func newFlagSet(path string) *flagSet {
	fs := flag.NewFlagSet(path, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return &flagSet{path: path, fs: fs, meta: map[string]flagMeta{}}
}

func (f *flagSet) add(name string, v flag.Value, usage string, m flagMeta) {
	f.fs.Var(v, name, usage)
	f.meta[name] = m
	f.order = append(f.order, name)
}

// String is a flag --name VALUE; values, when given, are the only ones
// completion offers (the API checks them).
func (f *flagSet) String(name, placeholder, usage string, values ...string) *string {
	p := new(string)
	f.add(name, (*stringValue)(p), usage, flagMeta{placeholder: placeholder, values: values})
	return p
}

// Bool is a flag --name (or --name=false).
func (f *flagSet) Bool(name, usage string) *bool {
	p := new(bool)
	f.add(name, (*boolValue)(p), usage, flagMeta{})
	return p
}

// Int is a flag --name N.
func (f *flagSet) Int(name, placeholder, usage string) *int {
	p := new(int)
	f.add(name, (*intValue)(p), usage, flagMeta{placeholder: placeholder})
	return p
}

// List is a flag that may be given again and again; each value is kept,
// in order.
func (f *flagSet) List(name, placeholder, usage string) *[]string {
	p := new([]string)
	f.add(name, (*listValue)(p), usage, flagMeta{placeholder: placeholder, repeat: true})
	return p
}

// parse splits args into positionals and flags, setting the flags.
func (f *flagSet) parse(args []string) (positional []string, help bool, err error) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			return append(positional, args[i+1:]...), help, nil
		case a == "-h" || a == "--help":
			help = true
		case strings.HasPrefix(a, "--"):
			name, value, hasValue := strings.Cut(a[2:], "=")
			fl := f.fs.Lookup(name)
			if fl == nil {
				msg := fmt.Sprintf("unknown flag --%s for %s", name, f.path)
				if s := suggest(name, f.order); s != "" {
					msg += fmt.Sprintf("; did you mean --%s?", s)
				}
				return nil, help, usagef("%s", msg)
			}
			if _, isBool := fl.Value.(*boolValue); isBool && !hasValue {
				value, hasValue = "true", true
			}
			if !hasValue {
				if i+1 >= len(args) {
					return nil, help, usagef("flag --%s needs a value: --%s %s", name, name, f.meta[name].placeholder)
				}
				i++
				value = args[i]
			}
			if err := fl.Value.Set(value); err != nil {
				// Set's errors quote the value only where it cannot be a
				// secret typed in the wrong place (a number).
				return nil, help, usagef("flag --%s: %v", name, err)
			}
		case strings.HasPrefix(a, "-") && len(a) > 1:
			return nil, help, usagef("unknown flag %s for %s: flags are spelled --name (to pass a word that begins with -, put it after --)", a, f.path)
		default:
			positional = append(positional, a)
		}
	}
	return positional, help, nil
}

// writeFlags lists the flags for --help, aligned.
func (f *flagSet) writeFlags(w io.Writer) {
	type line struct{ left, usage string }
	lines := []line{}
	width := 0
	for _, name := range f.order {
		m := f.meta[name]
		left := "--" + name
		if m.placeholder != "" {
			left += " " + m.placeholder
		}
		usage := f.fs.Lookup(name).Usage
		if m.repeat {
			usage += " (repeatable)"
		}
		if len(m.values) > 0 {
			usage += ": " + strings.Join(m.values, ", ")
		}
		lines = append(lines, line{left, usage})
		width = max(width, len(left))
	}
	lines = append(lines, line{"-h, --help", "show this help"})
	width = max(width, len("-h, --help"))
	for _, l := range lines {
		fmt.Fprintf(w, "  %-*s  %s\n", width, l.left, l.usage)
	}
}

type stringValue string

func (s *stringValue) Set(v string) error {
	if v == "" {
		return fmt.Errorf("an empty value: omit the flag instead")
	}
	*s = stringValue(v)
	return nil
}
func (s *stringValue) String() string { return string(*s) }

type boolValue bool

func (b *boolValue) Set(v string) error {
	p, err := strconv.ParseBool(v)
	if err != nil {
		return fmt.Errorf("want true or false")
	}
	*b = boolValue(p)
	return nil
}
func (b *boolValue) String() string { return strconv.FormatBool(bool(*b)) }

type intValue int

func (n *intValue) Set(v string) error {
	p, err := strconv.Atoi(v)
	if err != nil {
		return fmt.Errorf("%q is not a whole number", v)
	}
	*n = intValue(p)
	return nil
}
func (n *intValue) String() string { return strconv.Itoa(int(*n)) }

type listValue []string

func (l *listValue) Set(v string) error {
	*l = append(*l, v)
	return nil
}
func (l *listValue) String() string { return strings.Join(*l, ",") }
