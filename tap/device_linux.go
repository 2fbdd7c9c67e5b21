package tap

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/songgao/water"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ipoibcm/ipoib/offload"
)

// Config describes a TAP device to open.
type Config struct {
	// Name is the interface name, e.g. "ib0".
	Name string
	// Netns is the namespace the device lives in; nil means the caller's.
	Netns *Netns
	// Link is applied once the device exists. Leave Link.Up false to let
	// the ipoibcm.Interface raise the link when its broadcast join
	// completes (HostPort.SetLinkUp).
	Link LinkConfig
	// VnetHdr opens the TAP with IFF_VNET_HDR and offers the host stack
	// checksum, TSO and USO offload (see Device.Offloads): reads return
	// fewer, larger frames, which ReadFrames finishes in software and
	// ReadPacket hands over as they are. Off by default: one plain frame
	// per read(2), as before.
	VnetHdr bool
	// Queues above 1 opens the TAP with IFF_MULTI_QUEUE and that many
	// queues, one fd each with the same vnet header and offloads
	// (Device.Queues); it needs VnetHdr. 0 and 1 open one queue without
	// the flag, exactly as before.
	Queues int
}

// Device is a kernel TAP opened through water, or with Config.VnetHdr
// directly through /dev/net/tun. It implements ipoibcm.HostPort: each
// read(2) on a TAP returns exactly one frame, so the batch size is 1,
// except in vnet mode, where one read may be a super frame that
// ReadFrames cuts into up to VnetMaxSegments frames.
//
// ReadFrames and WriteFrames may run concurrently with each other and with
// the netlink setters.
type Device struct {
	name  string
	ns    *Netns
	index int
	mac   net.HardwareAddr
	file  io.ReadWriteCloser
	vnet  *vnet // nil unless Config.VnetHdr
	// queues are the further queues of an IFF_MULTI_QUEUE TAP
	// (Config.Queues), each a Device with its own fd and no netlink
	// handle; Close closes them.
	queues []*Device

	nlMu sync.Mutex // a netlink.Handle is not safe for concurrent requests
	nl   *netlink.Handle
	// linkLocal is the IPv6 link-local address SetLinkLocal chose; nlMu.
	linkLocal netip.Addr

	closed    atomic.Bool
	closeOnce sync.Once
	closeErr  error
}

// Open creates the TAP in cfg.Netns, configures it and reads back its
// kernel MAC.
func Open(cfg Config) (*Device, error) {
	if cfg.Name == "" {
		return nil, errors.New("tap: open: empty name")
	}
	if cfg.VnetHdr {
		return openVnetDevice(cfg)
	}
	if cfg.Queues > 1 {
		return nil, fmt.Errorf("tap %s: open: %d queues need VnetHdr", cfg.Name, cfg.Queues)
	}
	var ifce *water.Interface
	create := func() error {
		// Hold ForkLock so no concurrent fork+exec (iperf3 in the bench)
		// inherits the fd in the window before close-on-exec is set;
		// water opens it without O_CLOEXEC.
		syscall.ForkLock.RLock()
		defer syscall.ForkLock.RUnlock()
		var err error
		ifce, err = water.New(water.Config{
			DeviceType:             water.TAP,
			PlatformSpecificParams: water.PlatformSpecificParams{Name: cfg.Name},
		})
		if err != nil {
			return fmt.Errorf("tunsetiff: %w", err)
		}
		return setCloseOnExec(ifce)
	}
	var err error
	if cfg.Netns != nil {
		err = cfg.Netns.Do(create)
	} else {
		err = create()
	}
	if err != nil {
		if ifce != nil {
			ifce.Close()
		}
		return nil, fmt.Errorf("tap %s: open: %w", cfg.Name, err)
	}
	d := &Device{name: ifce.Name(), ns: cfg.Netns, file: ifce}
	if err := d.setup(cfg.Link); err != nil {
		d.Close()
		return nil, fmt.Errorf("tap %s: %w", cfg.Name, err)
	}
	return d, nil
}

func openVnetDevice(cfg Config) (*Device, error) {
	multi := cfg.Queues > 1
	var d *Device
	open := func() error {
		q, err := openVnetQueue(cfg.Name, multi, offloadLadder, cfg.Netns)
		if err != nil {
			return err
		}
		d = q
		// Every further queue asks for exactly what the first got: the
		// kernel keeps one offload set per device (TUNSETOFFLOAD).
		same := []Offloads{Offloads(d.vnet.offloads.Load())}
		for range cfg.Queues - 1 {
			q, err := openVnetQueue(d.name, true, same, cfg.Netns)
			if err != nil {
				return fmt.Errorf("queue %d: %w", len(d.queues)+1, err)
			}
			d.queues = append(d.queues, q)
		}
		return nil
	}
	var err error
	if cfg.Netns != nil {
		err = cfg.Netns.Do(open)
	} else {
		err = open()
	}
	if err != nil {
		if d != nil {
			d.Close()
		}
		return nil, fmt.Errorf("tap %s: open: %w", cfg.Name, err)
	}
	if err := d.setup(cfg.Link); err != nil {
		d.Close()
		return nil, fmt.Errorf("tap %s: %w", cfg.Name, err)
	}
	for _, q := range d.queues {
		q.index, q.mac = d.index, d.mac
	}
	return d, nil
}

// openVnetQueue opens one vnet fd of the TAP name as a Device without
// netlink (setup gives the first one its handle).
func openVnetQueue(name string, multi bool, ladder []Offloads, ns *Netns) (*Device, error) {
	f, name, o, err := openVnet(name, multi, ladder)
	if err != nil {
		return nil, err
	}
	v, err := newVnet(f, o)
	if err != nil {
		f.Close()
		return nil, err
	}
	return &Device{name: name, ns: ns, file: f, vnet: v}, nil
}

// Queues returns the device's queues: the Device itself first, then the
// further queues of an IFF_MULTI_QUEUE TAP. A further queue reads and
// writes only the flows the kernel hashed to it; its netlink methods
// (SetMTU, SetLinkUp, ...) fail, because the link is the first queue's.
func (d *Device) Queues() []*Device {
	return append([]*Device{d}, d.queues...)
}

func setCloseOnExec(ifce *water.Interface) error {
	f, ok := ifce.ReadWriteCloser.(*os.File)
	if !ok {
		return fmt.Errorf("water returned %T, want *os.File", ifce.ReadWriteCloser)
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return fmt.Errorf("syscallconn: %w", err)
	}
	if err := rc.Control(func(fd uintptr) { unix.CloseOnExec(int(fd)) }); err != nil {
		return fmt.Errorf("cloexec: %w", err)
	}
	return nil
}

func (d *Device) setup(cfg LinkConfig) error {
	var err error
	if d.ns != nil {
		d.nl, err = d.ns.Netlink()
	} else {
		d.nl, err = netlink.NewHandle()
	}
	if err != nil {
		return fmt.Errorf("netlink: %w", err)
	}
	link, err := d.nl.LinkByName(d.name)
	if err != nil {
		return fmt.Errorf("netlink: link: %w", err)
	}
	d.index = link.Attrs().Index
	d.mac = append(net.HardwareAddr(nil), link.Attrs().HardwareAddr...)
	if len(d.mac) != 6 {
		return fmt.Errorf("netlink: link has %d-byte address, want a 6-byte MAC", len(d.mac))
	}
	if d.vnet != nil {
		if err := limitSegments(d.nl, link); err != nil {
			return fmt.Errorf("netlink: %w", err)
		}
	}
	// Before the link can come up: its first NETDEV_UP announces it.
	if err := d.enableAnnounce(); err != nil {
		return err
	}
	return configureLink(d.nl, link, cfg)
}

// Name is the kernel interface name.
func (d *Device) Name() string { return d.name }

// Index is the kernel interface index inside the device's namespace.
func (d *Device) Index() int { return d.index }

// BatchSize is 1: a TAP read returns one frame per system call; in vnet
// mode that frame may become VnetMaxSegments.
func (d *Device) BatchSize() int {
	if d.vnet != nil {
		return VnetMaxSegments
	}
	return 1
}

// HostMAC is the TAP's kernel MAC: the host stack's own address on ib0.
func (d *Device) HostMAC() net.HardwareAddr { return d.mac }

// ReadFrames blocks for one frame and reads it into bufs[0]. A frame
// longer than the buffer is cut to the buffer's length.
func (d *Device) ReadFrames(bufs [][]byte, sizes []int) (int, error) {
	if len(bufs) == 0 || len(sizes) == 0 {
		return 0, nil
	}
	if d.vnet != nil {
		return d.readFramesVnet(bufs, sizes)
	}
	n, err := d.file.Read(bufs[0])
	if err != nil {
		if d.closed.Load() || errors.Is(err, os.ErrClosed) {
			return 0, fmt.Errorf("tap %s: read: %w", d.name, net.ErrClosed)
		}
		return 0, fmt.Errorf("tap %s: read: %w", d.name, err)
	}
	sizes[0] = min(n, len(bufs[0]))
	return 1, nil
}

// WriteFrames writes each frame with one write(2). It stops at the first
// error and reports how many frames went out before it.
func (d *Device) WriteFrames(frames [][]byte) (int, error) {
	if d.vnet != nil {
		return d.writeFramesVnet(frames)
	}
	for i, f := range frames {
		if _, err := d.file.Write(f); err != nil {
			if d.closed.Load() || errors.Is(err, os.ErrClosed) {
				return i, fmt.Errorf("tap %s: write: %w", d.name, net.ErrClosed)
			}
			return i, fmt.Errorf("tap %s: write frame of %d bytes: %w", d.name, len(f), err)
		}
	}
	return len(frames), nil
}

func (d *Device) link() (netlink.Link, error) {
	if d.nl == nil {
		return nil, fmt.Errorf("tap %s: link: a further queue has no netlink handle (use the first queue)", d.name)
	}
	l, err := d.nl.LinkByIndex(d.index)
	if err != nil {
		return nil, fmt.Errorf("tap %s: link: %w", d.name, err)
	}
	return l, nil
}

// SetMTU sets the TAP's MTU through netlink.
func (d *Device) SetMTU(mtu int) error {
	d.nlMu.Lock()
	defer d.nlMu.Unlock()
	if d.closed.Load() {
		return fmt.Errorf("tap %s: set mtu: %w", d.name, net.ErrClosed)
	}
	l, err := d.link()
	if err != nil {
		return err
	}
	if err := d.nl.LinkSetMTU(l, mtu); err != nil {
		return fmt.Errorf("tap %s: set mtu %d: %w", d.name, mtu, err)
	}
	return nil
}

// SetLinkUp sets the TAP administratively up or down. The TAP's carrier
// itself follows our open fd, so admin state is what tells the host
// whether ib0 can carry traffic.
func (d *Device) SetLinkUp(up bool) error {
	d.nlMu.Lock()
	defer d.nlMu.Unlock()
	if d.closed.Load() {
		return fmt.Errorf("tap %s: set link: %w", d.name, net.ErrClosed)
	}
	l, err := d.link()
	if err != nil {
		return err
	}
	if up {
		err = d.nl.LinkSetUp(l)
	} else {
		err = d.nl.LinkSetDown(l)
	}
	if err != nil {
		return fmt.Errorf("tap %s: set link up=%t: %w", d.name, up, err)
	}
	if up {
		return d.applyLinkLocal(l)
	}
	return nil
}

// Close unblocks ReadFrames and removes the device (it is not
// persistent), with every further queue. It is safe to call more than
// once.
func (d *Device) Close() error {
	d.closeOnce.Do(func() {
		d.closed.Store(true)
		if err := d.file.Close(); err != nil {
			d.closeErr = fmt.Errorf("tap %s: close: %w", d.name, err)
		}
		for k, q := range d.queues {
			if err := q.Close(); err != nil && d.closeErr == nil {
				d.closeErr = fmt.Errorf("tap %s: close queue %d: %w", d.name, k+1, err)
			}
		}
		d.nlMu.Lock()
		if d.nl != nil {
			d.nl.Close()
			d.nl = nil
		}
		d.nlMu.Unlock()
	})
	return d.closeErr
}

// NumQueues is how many queues the device has (Config.Queues, at least 1).
func (d *Device) NumQueues() int { return 1 + len(d.queues) }

// queue is queue q: the Device itself for 0.
func (d *Device) queue(q int) *Device {
	if q == 0 {
		return d
	}
	return d.queues[q-1]
}

// ReadQueue is ReadFramesMeta on queue q (ipoibcm.MultiQueuePort).
func (d *Device) ReadQueue(q int, bufs [][]byte, sizes []int, meta []offload.Meta) (int, error) {
	return d.queue(q).ReadFramesMeta(bufs, sizes, meta)
}

// WriteQueue is WriteFramesMeta on queue q, or WriteFrames with meta nil.
func (d *Device) WriteQueue(q int, frames [][]byte, meta []offload.Meta) (int, error) {
	if meta == nil {
		return d.queue(q).WriteFrames(frames)
	}
	return d.queue(q).WriteFramesMeta(frames, meta)
}

// WriteQueueGather is WriteFramesGather on queue q.
func (d *Device) WriteQueueGather(q int, frames [][][]byte, meta []offload.Meta) (int, error) {
	return d.queue(q).WriteFramesGather(frames, meta)
}
