package config

import (
	"bytes"
	"fmt"
	"strings"

	"github.com/pelletier/go-toml/v2/unstable"
)

// lineIndex is where each key of a document stands: the decoded map has
// the values but not their lines, which every message names.
type lineIndex struct {
	line map[string]int
	// order is the keys in document order: top-level keys and tables by
	// name, [[child]] tables as child[N], their keys as child[N].key.
	order []string
}

func (l *lineIndex) of(key string) int {
	if n, ok := l.line[key]; ok {
		return n
	}
	// A key inside a child that is missing: its table's line.
	if i := strings.LastIndexByte(key, '.'); i > 0 {
		return l.of(key[:i])
	}
	return 1
}

func (l *lineIndex) add(key string, line int) {
	if _, ok := l.line[key]; ok {
		return
	}
	l.line[key] = line
	l.order = append(l.order, key)
}

// keyLines indexes the keys of data, which toml.Unmarshal accepted.
func keyLines(data []byte) (*lineIndex, error) {
	idx := &lineIndex{line: map[string]int{}}
	var p unstable.Parser
	p.Reset(data)
	table := "" // the current table's key prefix; "" at the top
	children := map[string]int{}
	lineAt := func(n *unstable.Node) int { return 1 + bytes.Count(data[:n.Raw.Offset], []byte{'\n'}) }
	for p.NextExpression() {
		e := p.Expression()
		switch e.Kind {
		case unstable.KeyValue, unstable.Table, unstable.ArrayTable:
		default:
			continue
		}
		it := e.Key()
		var parts []string
		var first *unstable.Node
		for it.Next() {
			if first == nil {
				first = it.Node()
			}
			parts = append(parts, string(it.Node().Data))
		}
		if first == nil {
			continue
		}
		line := lineAt(first)
		switch e.Kind {
		case unstable.Table:
			table = strings.Join(parts, ".")
			idx.add(parts[0], line)
		case unstable.ArrayTable:
			name := strings.Join(parts, ".")
			children[name]++
			table = fmt.Sprintf("%s[%d]", name, children[name])
			idx.add(parts[0], line)
			idx.add(table, line)
		case unstable.KeyValue:
			key := strings.Join(parts, ".")
			if table != "" {
				key = table + "." + key
			}
			idx.add(strings.SplitN(key, ".", 2)[0], line)
			idx.add(key, line)
		}
	}
	if err := p.Error(); err != nil {
		return nil, fmt.Errorf("parse: %w", err)
	}
	return idx, nil
}
