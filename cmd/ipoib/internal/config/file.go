package config

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pelletier/go-toml/v2"

	"github.com/ipoibcm/ipoib/internal/flagcheck"
)

// MaxSize bounds a config file: one host's settings fit in a few
// kilobytes, and a larger file is a mistake, not a reason to read it all.
const MaxSize = 1 << 20

// ChildKey is the array of tables that lists the P_Key children.
const ChildKey = "child"

// Kind is the TOML type a key takes and how it becomes a flag value.
type Kind int

// Kinds of keys.
const (
	String   Kind = iota // a TOML string
	List                 // an array of strings, or one string (comma-separated)
	Bool                 // true or false
	Int                  // an integer
	Uint                 // an integer >= 0
	Float                // a float or an integer
	Duration             // a string time.ParseDuration takes ("50ms")
)

func (k Kind) String() string {
	switch k {
	case String:
		return "a string"
	case List:
		return "an array of strings"
	case Bool:
		return "true or false"
	case Int:
		return "an integer"
	case Uint:
		return "an integer >= 0"
	case Float:
		return "a number"
	case Duration:
		return `a duration string like "50ms"`
	}
	return "?"
}

// Schema is the keys a file may have at the top level.
type Schema map[string]Kind

// Setting is one top-level key: Value is its flag spelling (flag.Value's
// Set takes it), Line where the key stands.
type Setting struct {
	Key, Value string
	Line       int
}

// Child is one [[child]] table: a P_Key child interface.
type Child struct {
	PKey  uint16 // as given: bit 15 the membership
	Name  string // empty: <dev>.<pkey>
	Addrs []netip.Prefix
	Line  int // of its [[child]] header
}

// File is a parsed, checked config file.
type File struct {
	Path     string
	Settings []Setting // in the file's order
	Children []Child
}

// Setting returns the setting of key, if the file has it.
func (f *File) Setting(key string) (Setting, bool) {
	i := slices.IndexFunc(f.Settings, func(s Setting) bool { return s.Key == key })
	if i < 0 {
		return Setting{}, false
	}
	return f.Settings[i], true
}

// Error is one problem with a file: where and which key.
type Error struct {
	Path string
	Line int    // 1-based; the key's line
	Key  string // "" for a syntax error; "child[2].pkey" inside a child
	Msg  string
}

func (e *Error) Error() string {
	if e.Key == "" {
		return fmt.Sprintf("%s:%d: %s", e.Path, e.Line, e.Msg)
	}
	return fmt.Sprintf("%s:%d: %s: %s", e.Path, e.Line, e.Key, e.Msg)
}

// Load reads and parses the file at path.
func Load(path string, s Schema) (*File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxSize+1))
	if err != nil {
		return nil, fmt.Errorf("config: read %s: %w", path, err)
	}
	if len(data) > MaxSize {
		return nil, &Error{Path: path, Line: 1, Msg: fmt.Sprintf("larger than %d bytes", MaxSize)}
	}
	return Parse(path, data, s)
}

// Parse parses data, the contents of the file named path.
func Parse(path string, data []byte, s Schema) (*File, error) {
	var doc map[string]any
	if err := toml.Unmarshal(data, &doc); err != nil {
		var de *toml.DecodeError
		if errors.As(err, &de) {
			line, _ := de.Position()
			return nil, &Error{Path: path, Line: line, Key: strings.Join(de.Key(), "."), Msg: strings.TrimPrefix(de.Error(), "toml: ")}
		}
		return nil, &Error{Path: path, Line: 1, Msg: err.Error()}
	}
	lines, err := keyLines(data)
	if err != nil {
		return nil, &Error{Path: path, Line: 1, Msg: err.Error()}
	}
	f := &File{Path: path}
	bad := func(key string, msg string, args ...any) error {
		return &Error{Path: path, Line: lines.of(key), Key: key, Msg: fmt.Sprintf(msg, args...)}
	}
	for _, key := range lines.order {
		if strings.ContainsAny(key, ".[") {
			continue // a child's key, or the second part of a dotted key
		}
		v := doc[key]
		if key == ChildKey {
			if err := f.children(v, bad); err != nil {
				return nil, err
			}
			continue
		}
		kind, ok := s[key]
		if !ok {
			return nil, bad(key, "unknown key%s", suggest(key, s))
		}
		text, msg := flagText(kind, v)
		if msg != "" {
			return nil, bad(key, "%s", msg)
		}
		f.Settings = append(f.Settings, Setting{Key: key, Value: text, Line: lines.of(key)})
	}
	return f, nil
}

// children checks the [[child]] tables.
func (f *File) children(v any, bad func(string, string, ...any) error) error {
	tables, ok := v.([]any)
	if !ok {
		if _, isMap := v.(map[string]any); !isMap {
			return bad(ChildKey, "want [[child]] tables, got %s", typeName(v))
		}
		return bad(ChildKey, "want [[child]] (an array of tables), not [child]")
	}
	for i, t := range tables {
		m, ok := t.(map[string]any)
		prefix := fmt.Sprintf("%s[%d]", ChildKey, i+1)
		if !ok {
			return bad(ChildKey, "want [[child]] tables, got %s", typeName(t))
		}
		c := Child{Line: 0}
		for _, k := range sortedKeys(m) {
			key := prefix + "." + k
			switch k {
			case "pkey":
				var s string
				switch p := m[k].(type) {
				case string:
					s = p
				case int64:
					s = strconv.FormatInt(p, 10)
				default:
					return bad(key, "want a P_Key like \"0x8001\", got %s", typeName(p))
				}
				pk, msg := flagcheck.PKey("P_Key", s)
				if msg != "" {
					return bad(key, "%s", msg)
				}
				c.PKey = pk
			case "name":
				s, ok := m[k].(string)
				if !ok {
					return bad(key, "want a string, got %s", typeName(m[k]))
				}
				if msg := flagcheck.Ifname("name", s); msg != "" {
					return bad(key, "%s", strings.TrimPrefix(msg, "--name "))
				}
				c.Name = s
			case "addrs":
				items, ok := m[k].([]any)
				if !ok {
					return bad(key, "want an array of IP prefixes, got %s", typeName(m[k]))
				}
				for _, it := range items {
					s, ok := it.(string)
					if !ok {
						return bad(key, "want an array of IP prefixes, got an element of %s", typeName(it))
					}
					p, err := netip.ParsePrefix(s)
					if err != nil {
						return bad(key, "%q: want an IP prefix like 10.77.1.1/24", s)
					}
					c.Addrs = append(c.Addrs, p)
				}
			default:
				return bad(key, "unknown key (a child has pkey, name, addrs)")
			}
		}
		hdr := prefix
		c.Line = f.lineOf(hdr, bad)
		if c.PKey == 0 {
			return bad(hdr, "missing required key pkey")
		}
		for _, o := range f.Children {
			if o.PKey&0x7FFF == c.PKey&0x7FFF {
				return bad(prefix+".pkey", "partition 0x%04x is also the child at line %d", c.PKey|0x8000, o.Line)
			}
			if c.Name != "" && o.Name == c.Name {
				return bad(prefix+".name", "%s is also the child at line %d", c.Name, o.Line)
			}
		}
		f.Children = append(f.Children, c)
	}
	return nil
}

// lineOf recovers the line bad would report for key.
func (f *File) lineOf(key string, bad func(string, string, ...any) error) int {
	var e *Error
	if errors.As(bad(key, ""), &e) {
		return e.Line
	}
	return 0
}

// flagText is v, a key of kind k, spelled as its flag takes it; a
// non-empty message says why v is not of that kind.
func flagText(k Kind, v any) (string, string) {
	want := func() string { return fmt.Sprintf("want %s, got %s", k, typeName(v)) }
	switch k {
	case String:
		if s, ok := v.(string); ok {
			return s, ""
		}
	case List:
		switch l := v.(type) {
		case string:
			return l, ""
		case []any:
			parts := make([]string, 0, len(l))
			for _, it := range l {
				s, ok := it.(string)
				if !ok {
					return "", fmt.Sprintf("want an array of strings, got an element of %s", typeName(it))
				}
				if strings.Contains(s, ",") {
					return "", fmt.Sprintf("%q: one item per string", s)
				}
				parts = append(parts, s)
			}
			return strings.Join(parts, ","), ""
		}
	case Bool:
		if b, ok := v.(bool); ok {
			return strconv.FormatBool(b), ""
		}
	case Int:
		if n, ok := v.(int64); ok {
			return strconv.FormatInt(n, 10), ""
		}
	case Uint:
		if n, ok := v.(int64); ok {
			if n < 0 {
				return "", fmt.Sprintf("%d: want an integer >= 0", n)
			}
			return strconv.FormatInt(n, 10), ""
		}
	case Float:
		switch n := v.(type) {
		case float64:
			return strconv.FormatFloat(n, 'g', -1, 64), ""
		case int64:
			return strconv.FormatInt(n, 10), ""
		}
	case Duration:
		if s, ok := v.(string); ok {
			if _, err := time.ParseDuration(s); err != nil {
				return "", fmt.Sprintf("%q: want a duration like \"50ms\"", s)
			}
			return s, ""
		}
	}
	return "", want()
}

// typeName names a decoded TOML value's type for a message.
func typeName(v any) string {
	switch v.(type) {
	case string:
		return "a string"
	case bool:
		return "a boolean"
	case int64:
		return "an integer"
	case float64:
		return "a float"
	case []any:
		return "an array"
	case map[string]any:
		return "a table"
	case time.Time, toml.LocalDate, toml.LocalDateTime, toml.LocalTime:
		return "a date or time"
	}
	return fmt.Sprintf("%T", v)
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// suggest names the schema key closest to an unknown one (a typo of a
// flag name, or its spelling with underscores).
func suggest(key string, s Schema) string {
	alt := strings.ReplaceAll(key, "_", "-")
	if _, ok := s[alt]; ok && alt != key {
		return fmt.Sprintf(" (did you mean %s?)", alt)
	}
	return ""
}
