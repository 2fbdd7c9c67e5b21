package cli

// fabricIBMTU is the soft fabric's port MTU, which bounds datagram mode's
// IP MTU on the fabric (internal/flagcheck.MTU).
const fabricIBMTU = 4096
