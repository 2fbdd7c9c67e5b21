package control

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeParent takes children the way the CLI's hosts do: one per
// partition, named <parent>.<pkey> unless named.
type fakeParent struct {
	*fakeEndpoint
	mu       sync.Mutex
	children []*fakeEndpoint
}

func (p *fakeParent) AddChild(c ChildRequest) (Endpoint, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	key := PKeyString(c.PKey | 0x8000)
	for _, k := range p.children {
		if k.info.PKey == key {
			return nil, fmt.Errorf("partition %s has an interface already", key)
		}
	}
	name := c.Name
	if name == "" {
		name = fmt.Sprintf("%s.%04x", p.Info().Name, c.PKey)
	}
	info := p.Info()
	info.Name, info.PKey, info.Parent, info.Addrs = name, key, p.Info().Name, c.Addrs
	info.Membership = "full"
	if c.PKey&0x8000 == 0 {
		info.Membership = "limited"
	}
	k := &fakeEndpoint{info: info, stats: map[string]any{}}
	p.children = append(p.children, k)
	return k, nil
}

func (p *fakeParent) DeleteChild(name string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	i := slices.IndexFunc(p.children, func(k *fakeEndpoint) bool { return k.info.Name == name })
	if i < 0 {
		return errors.New("no such child")
	}
	p.children = slices.Delete(p.children, i, i+1)
	return nil
}

func (p *fakeParent) Children() []Endpoint {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]Endpoint, len(p.children))
	for i, k := range p.children {
		out[i] = k
	}
	return out
}

func TestChildAddDelOverTheSocket(t *testing.T) {
	h1 := &fakeParent{fakeEndpoint: newFake("ipoib-h1")}
	h2 := &fakeParent{fakeEndpoint: newFake("ipoib-h2")}
	_, dir := startServer(t, h1, h2)
	const to = 5 * time.Second

	if _, err := ChildAdd(dir, "", ChildRequest{PKey: 0x8001}, to); err == nil || !strings.Contains(err.Error(), "2 hosts run (ipoib-h1, ipoib-h2); name one with --host") {
		t.Fatalf("add without host on two hosts: %v", err)
	}
	info, err := ChildAdd(dir, "ipoib-h2", ChildRequest{PKey: 0x0001, Addrs: []string{"10.77.1.2/24"}}, to)
	if err != nil {
		t.Fatal(err)
	}
	if info.Name != "ib0.0001" || info.PKey != "0x8001" || info.Membership != "limited" || info.Parent != "ib0" {
		t.Fatalf("child %+v", info)
	}
	if _, err := ChildAdd(dir, "ipoib-h2", ChildRequest{PKey: 0x8001}, to); err == nil || !strings.Contains(err.Error(), "has an interface already") {
		t.Fatalf("duplicate: %v", err)
	}
	if _, err := ChildAdd(dir, "ipoib-h9", ChildRequest{PKey: 0x8002}, to); !errors.Is(err, ErrNoSuchHost) {
		t.Fatalf("unknown host: %v", err)
	}
	for _, bad := range []ChildRequest{{PKey: 0}, {PKey: 0x8000}, {PKey: 0x8002, Name: "a-name-of-16-byt"}, {PKey: 0x8002, Addrs: []string{"10.1.1.1"}}} {
		if _, err := ChildAdd(dir, "ipoib-h1", bad, to); !errors.Is(err, ErrProtocol) && (err == nil || !strings.Contains(err.Error(), ErrProtocol.Error())) {
			t.Fatalf("bad child %+v: %v", bad, err)
		}
	}
	if n := len(h1.Children()); n != 0 {
		t.Fatalf("refused adds left %d children on h1", n)
	}

	// The child is listed after its parent and selected like any interface.
	resps, err := QueryAll(dir, Request{Op: OpList, Host: "ipoib-h2"}, to)
	if err != nil || len(resps) != 1 || len(resps[0].Interfaces) != 2 || resps[0].Interfaces[1].Name != "ib0.0001" {
		t.Fatalf("list h2: %v %+v", err, resps)
	}
	resps, err = QueryAll(dir, Request{Op: OpStats, Host: "ipoib-h2", Name: "ib0.0001"}, to)
	if err != nil || len(resps[0].Stats) != 1 || resps[0].Stats[0].Interface.Parent != "ib0" {
		t.Fatalf("stats of the child: %v %+v", err, resps)
	}
	infos, err := SetModeAll(dir, "ipoib-h2", "ib0.0001", "datagram", to)
	if err != nil || len(infos) != 1 || infos[0].Name != "ib0.0001" || h2.Info().Mode != "connected" {
		t.Fatalf("mode of the child alone: %v %+v, parent %s", err, infos, h2.Info().Mode)
	}

	if _, err := ChildDel(dir, "ipoib-h2", "ib0.7777", 0, to); !errors.Is(err, ErrNoSuchInterface) && (err == nil || !strings.Contains(err.Error(), ErrNoSuchInterface.Error())) {
		t.Fatalf("del unknown child: %v", err)
	}
	if _, err := ChildDel(dir, "ipoib-h2", "ib0", 0, to); err == nil {
		t.Fatal("deleted the parent")
	}
	info, err = ChildDel(dir, "ipoib-h2", "", 0x8001, to)
	if err != nil || info.Name != "ib0.0001" {
		t.Fatalf("del by P_Key: %v %+v", err, info)
	}
	if n := len(h2.Children()); n != 0 {
		t.Fatalf("%d children after del", n)
	}
}
