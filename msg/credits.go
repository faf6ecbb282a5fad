package msg

// dataReserve is how many credits messages of data (and the stream) leave
// to the control loop, which spends them by these rules:
//
//   - the last credit goes only with credits for the peer (as RDS spends
//     it). A message that took a side's last credit and gave none back
//     could leave both sides with none, each owing the other credits it
//     could no longer send; with the rule, the side that spent its last
//     credit last gave the peer one, and the message that took it,
//     reposted at once, is a credit the peer owes back;
//   - credits are owed (creditState.due) when half the receives were
//     reposted, when the application released a message and the peer is
//     down to the reserve (it may wait to send), when the peer is down to
//     one credit (it cannot ask: it may owe a confirmation), and when the
//     peer asks for them (FlagWantsCredit) and they would let its data
//     go;
//   - a side whose data waits for credits asks once, while the peer's
//     receives have room for it (creditState.wantsCredit).
//
// Receives of control messages, reposted as they arrive, are not by
// themselves a reason to send a credit message: each such message takes
// a receive, so returning them would answer credits with credits for
// ever. Three credits are what lets the rules keep every side able to
// speak without that: with two, two sides whose applications hold all
// the data they may have one credit between them each way, and the rule
// for a peer down to one would pass it back and forth (docs/DESIGN.md).
// TestCreditRulesSettle explores the rules exhaustively.
const dataReserve = 3

// creditState is what the credit rules look at on one side. The rules are
// its methods, pure functions of it, so that a model of two sides
// (TestCreditRulesSettle) runs the very rules a Conn does.
type creditState struct {
	credits     int  // messages this side may send
	toGrant     int  // receives reposted and not yet granted
	grantAt     int  // toGrant owed in any case: half the receive depth
	released    bool // some of toGrant are data the application released
	peerCredits int  // messages the peer may send at most
	peerWants   bool // the peer's latest message said FlagWantsCredit
	dataWaits   bool // a send, the stream or the end of data waits for a credit
	peerRoom    int  // the peer's receives its application does not hold, less this side's data in flight
	dialer      bool // this side dialed: it yields when both sides ask
}

// dataMayGo says a message of data may take a credit: one is free beyond
// those kept back for the control loop.
func (s creditState) dataMayGo() bool { return s.credits > dataReserve }

// mayControl says the control loop may spend a credit now: its last one
// only with credits for the peer.
func (s creditState) mayControl() bool {
	return s.credits >= 2 || s.credits == 1 && s.toGrant > 0
}

// due says a credit message is owed. When both sides' data waits and each
// asked, the accepting side answers, unless its own data cannot go
// whatever the peer grants.
func (s creditState) due() bool {
	if s.toGrant == 0 {
		return false
	}
	switch {
	case s.toGrant >= s.grantAt, s.released && s.peerCredits <= dataReserve, s.peerCredits <= 1:
		return true
	case s.peerWants && s.peerCredits+s.toGrant > dataReserve:
		return !s.needsCredit() || !s.peerHasRoom() || !s.dialer
	}
	return false
}

// needsCredit says data waits for a credit.
func (s creditState) needsCredit() bool { return s.dataWaits && !s.dataMayGo() }

// peerHasRoom says the peer's receives could take this side's data beyond
// the reserve: credits it grants would let data go.
func (s creditState) peerHasRoom() bool { return s.peerRoom > dataReserve }

// wantsCredit says this side's messages ask for credits (FlagWantsCredit).
func (s creditState) wantsCredit() bool { return s.needsCredit() && s.peerHasRoom() }

// controlOwed says the control loop has a message to send: another reason
// (a greeting, a confirmation, the end of data, a keepalive), credits owed,
// or an ask not yet made (asked: this side's latest message asked). A send
// that waits for the credit that came goes first instead (sendWaits), and
// carries the credits owed.
func (s creditState) controlOwed(other, asked, sendWaits bool) bool {
	if sendWaits && s.dataMayGo() {
		return false
	}
	return other || s.due() || s.wantsCredit() && !asked
}
