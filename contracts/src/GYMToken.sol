// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.30;

import {ERC20} from "@openzeppelin/contracts/token/ERC20/ERC20.sol";

/// @title GYM token with operator staking, node binding and evidence-based slashing
/// @notice The ERC-20 token of hanzod's decentralized training network (18 decimals). The same
/// contract holds operators' stakes: an operator stakes GYM, binds the keys of the nodes it
/// runs, and can be slashed by a staked orchestrator on evidence of misbehaviour. Staked and
/// unbonding GYM sit in this contract's own balance; slashed GYM is burned.
/// @dev All amounts are in GYM wei (10^-18 GYM); all times are unix seconds.
contract GYMToken is ERC20("Gym", "GYM") {
    /// @notice The least active stake (GYM wei) a node operator is expected to hold.
    /// @dev Not enforced here: the orchestrator's admission checks it through `nodeStake`.
    uint256 public constant NODE_MIN_STAKE = 10_000 ether;

    /// @notice The least active stake (GYM wei) that makes an address an orchestrator.
    uint256 public constant ORCHESTRATOR_MIN_STAKE = 50_000 ether;

    /// @notice Seconds between `unstake` and the time the amount can be withdrawn.
    uint64 public immutable unbondingDelay;

    /// @notice Seconds a slashed node key stays penalized after a slash.
    uint64 public immutable penaltyWindow;

    /// @notice Active stake of an operator, in GYM wei.
    mapping(address => uint256) public stakes;

    /// @notice The operator a node key is bound to (the zero address when unbound).
    mapping(bytes32 => address) public nodeOperator;

    /// @notice The operator that last unbound a node key (the zero address when the key was
    /// never unbound). Written by `unbindNode`, never cleared, and not cleared when the key is
    /// bound again: `slash` falls back to it only while `nodeOperator` of the key is zero, so an
    /// operator cannot escape a slash by unbinding the key first.
    mapping(bytes32 => address) public formerOperator;

    /// @notice Unix seconds until which a node key is penalized (0 when it never was).
    mapping(bytes32 => uint64) public penaltyUntil;

    /// @notice Whether a piece of evidence, keyed by its SHA-256 hash, has already been used to slash.
    mapping(bytes32 => bool) public evidenceUsed;

    struct Unbonding {
        uint256 amount;
        uint64 unlockAt;
    }

    mapping(address => Unbonding) private _unbonding;

    /// @notice An operator staked `amount` GYM wei; its active stake is now `stakeAfter`.
    event Staked(address indexed operator, uint256 amount, uint256 stakeAfter);

    /// @notice An operator moved `amount` GYM wei from its active stake to unbonding; the whole
    /// unbonding amount can be withdrawn from `unlockAt` (unix seconds).
    event UnstakeRequested(address indexed operator, uint256 amount, uint64 unlockAt);

    /// @notice An operator withdrew `amount` GYM wei of unbonded stake.
    event Withdrawn(address indexed operator, uint256 amount);

    /// @notice `nodeKey` is now bound to `operator`.
    event NodeBound(bytes32 indexed nodeKey, address indexed operator);

    /// @notice `nodeKey` is no longer bound to `operator`.
    event NodeUnbound(bytes32 indexed nodeKey, address indexed operator);

    /// @notice A node was slashed.
    /// @param node The slashed node key.
    /// @param operator The operator whose stake was slashed: the one the node is bound to, or
    /// when it is unbound, its former operator (see `slash`).
    /// @param evidenceHash SHA-256 of `evidence`.
    /// @param reporter The address the orchestrator named as reporter.
    /// @param pct The percentage slashed, 1..=100.
    /// @param slashed GYM wei burned from the operator's active stake.
    /// @param unbondingSlashed GYM wei burned from the operator's unbonding amount.
    /// @param stakeAfter The operator's active stake after the slash, GYM wei.
    /// @param penaltyUntil Unix seconds until which the node key is penalized.
    /// @param evidence The evidence bytes, as given.
    event Slashed(
        bytes32 indexed node,
        address indexed operator,
        bytes32 indexed evidenceHash,
        address reporter,
        uint8 pct,
        uint256 slashed,
        uint256 unbondingSlashed,
        uint256 stakeAfter,
        uint64 penaltyUntil,
        bytes evidence
    );

    /// @notice A zero amount was given.
    error ZeroAmount();
    /// @notice An unstake asked for more than the active stake (both GYM wei).
    error InsufficientStake(uint256 staked, uint256 requested);
    /// @notice The caller has nothing unbonding.
    error NothingToWithdraw();
    /// @notice The unbonding amount cannot be withdrawn before `unlockAt` (unix seconds).
    error StillUnbonding(uint64 unlockAt);
    /// @notice The zero node key cannot be bound.
    error ZeroNodeKey();
    /// @notice `nodeKey` is bound to another operator, `operator`.
    error NodeBoundToOther(bytes32 nodeKey, address operator);
    /// @notice `caller` is not the operator `nodeKey` is bound to.
    error NotNodeOperator(bytes32 nodeKey, address caller);
    /// @notice `caller` does not hold `ORCHESTRATOR_MIN_STAKE` active stake.
    error NotOrchestrator(address caller);
    /// @notice A slash percentage outside 1..=100.
    error BadPercentage(uint8 pct);
    /// @notice The reporter is the zero address.
    error ZeroReporter();
    /// @notice No evidence was given.
    error EmptyEvidence();
    /// @notice `node` is bound to no operator and never was (no current or former operator).
    error Unbound(bytes32 node);
    /// @notice The evidence with this SHA-256 hash was already used.
    error EvidenceUsed(bytes32 evidenceHash);

    /// @notice Deploys the token and mints `initialSupply` GYM wei to `holder`.
    /// @param holder Receives the initial supply.
    /// @param initialSupply GYM wei minted to `holder`.
    /// @param unbondingDelay_ Seconds from `unstake` to `withdraw`.
    /// @param penaltyWindow_ Seconds a node key stays penalized after a slash.
    constructor(address holder, uint256 initialSupply, uint64 unbondingDelay_, uint64 penaltyWindow_) {
        unbondingDelay = unbondingDelay_;
        penaltyWindow = penaltyWindow_;
        _mint(holder, initialSupply);
    }

    /// @notice Stakes `amount` GYM wei of the caller's balance.
    /// @param amount GYM wei to move from the caller's balance to its active stake; > 0.
    function stake(uint256 amount) external {
        if (amount == 0) revert ZeroAmount();
        _transfer(msg.sender, address(this), amount);
        uint256 after_ = stakes[msg.sender] + amount;
        stakes[msg.sender] = after_;
        emit Staked(msg.sender, amount, after_);
    }

    /// @notice Starts unbonding `amount` GYM wei of the caller's active stake. The whole
    /// unbonding amount (this and any earlier one not yet withdrawn) unlocks `unbondingDelay`
    /// seconds from now. Unbonding stake is still slashable.
    /// @param amount GYM wei, 0 < amount <= active stake.
    function unstake(uint256 amount) external {
        if (amount == 0) revert ZeroAmount();
        uint256 staked = stakes[msg.sender];
        if (amount > staked) revert InsufficientStake(staked, amount);
        stakes[msg.sender] = staked - amount;
        Unbonding storage u = _unbonding[msg.sender];
        u.amount += amount;
        uint64 unlockAt = uint64(block.timestamp) + unbondingDelay;
        u.unlockAt = unlockAt;
        emit UnstakeRequested(msg.sender, amount, unlockAt);
    }

    /// @notice Withdraws the caller's whole unbonding amount once it has unlocked.
    function withdraw() external {
        Unbonding storage u = _unbonding[msg.sender];
        uint256 amount = u.amount;
        if (amount == 0) revert NothingToWithdraw();
        uint64 unlockAt = u.unlockAt;
        if (block.timestamp < unlockAt) revert StillUnbonding(unlockAt);
        delete _unbonding[msg.sender];
        _transfer(address(this), msg.sender, amount);
        emit Withdrawn(msg.sender, amount);
    }

    /// @notice Binds `nodeKey` to the caller. Binding a key already bound to the caller succeeds.
    /// @param nodeKey The node's key (its Ed25519 public key); not zero.
    function bindNode(bytes32 nodeKey) external {
        if (nodeKey == bytes32(0)) revert ZeroNodeKey();
        address current = nodeOperator[nodeKey];
        if (current != address(0) && current != msg.sender) revert NodeBoundToOther(nodeKey, current);
        nodeOperator[nodeKey] = msg.sender;
        emit NodeBound(nodeKey, msg.sender);
    }

    /// @notice Unbinds `nodeKey` from the caller, its operator, which stays slashable for the
    /// key: the caller becomes `formerOperator(nodeKey)`, and `slash` of the key hits it while
    /// the key is bound to no one (see `slash`). Any penalty stays on the key.
    /// @param nodeKey A node key bound to the caller.
    function unbindNode(bytes32 nodeKey) external {
        if (nodeOperator[nodeKey] != msg.sender) revert NotNodeOperator(nodeKey, msg.sender);
        delete nodeOperator[nodeKey];
        formerOperator[nodeKey] = msg.sender;
        emit NodeUnbound(nodeKey, msg.sender);
    }

    /// @notice The unbonding amount of `operator` and when it unlocks.
    /// @param operator The operator.
    /// @return amount GYM wei unbonding (0 when none).
    /// @return unlockAt Unix seconds from which `amount` can be withdrawn (0 when none).
    function unbonding(address operator) external view returns (uint256 amount, uint64 unlockAt) {
        Unbonding storage u = _unbonding[operator];
        return (u.amount, u.unlockAt);
    }

    /// @notice What admission needs to know about a node key, in one call. Never reverts.
    /// @param nodeKey The node key.
    /// @return operator The operator it is bound to (zero when unbound).
    /// @return stake The operator's active stake, GYM wei (0 when unbound).
    /// @return penaltyUntil_ Unix seconds until which the key is penalized (0 when never slashed).
    function nodeStake(bytes32 nodeKey) external view returns (address operator, uint256 stake, uint64 penaltyUntil_) {
        operator = nodeOperator[nodeKey];
        stake = operator == address(0) ? 0 : stakes[operator];
        penaltyUntil_ = penaltyUntil[nodeKey];
    }

    /// @notice Whether `a` holds at least `ORCHESTRATOR_MIN_STAKE` active stake.
    /// @param a The address.
    /// @return True when `a` may act as an orchestrator.
    function isOrchestrator(address a) public view returns (bool) {
        return stakes[a] >= ORCHESTRATOR_MIN_STAKE;
    }

    /// @notice Slashes the operator of `node` by `pct` percent of its active stake and of its
    /// unbonding amount (both rounded down, both burned), and penalizes `node` until at least
    /// `penaltyWindow` seconds from now. Each piece of evidence (by SHA-256) slashes once.
    /// Only an orchestrator may call this; it gains nothing from it (no bounty).
    /// The operator hit is `nodeOperator(node)`, the one the key is bound to now; when the key
    /// is unbound, it is `formerOperator(node)`, the operator that last unbound it, so unbinding
    /// before a slash lands does not escape it. Reverts `Unbound` only when the key has neither
    /// (it was never bound). The current operator always comes first: once a key is unbound,
    /// anyone may bind it again, and a later slash of the key then hits that new operator, not
    /// the former one, whenever the misbehaviour took place.
    /// @param node The node key to slash; bound now, or bound and unbound earlier.
    /// @param pct Percentage to slash, 1..=100.
    /// @param reporter The address that reported the misbehaviour; not zero. Recorded only.
    /// @param evidence The evidence; not empty. Not interpreted here: readers verify it.
    /// @return slashed GYM wei burned from the operator's active stake.
    function slash(bytes32 node, uint8 pct, address reporter, bytes calldata evidence)
        external
        returns (uint256 slashed)
    {
        if (!isOrchestrator(msg.sender)) revert NotOrchestrator(msg.sender);
        if (pct == 0 || pct > 100) revert BadPercentage(pct);
        if (reporter == address(0)) revert ZeroReporter();
        if (evidence.length == 0) revert EmptyEvidence();
        address op = nodeOperator[node];
        if (op == address(0)) {
            op = formerOperator[node];
            if (op == address(0)) revert Unbound(node);
        }
        bytes32 h = sha256(evidence);
        if (evidenceUsed[h]) revert EvidenceUsed(h);
        evidenceUsed[h] = true;

        SlashRecord memory r = SlashRecord(node, op, h, reporter, pct, 0, 0, 0, 0);
        _slashStake(r);
        r.penaltyUntil = _penalize(node);
        _emitSlashed(r, evidence);
        return r.slashed;
    }

    /// @dev What `slash` did, for its event (one memory struct keeps the stack shallow).
    struct SlashRecord {
        bytes32 node;
        address operator;
        bytes32 evidenceHash;
        address reporter;
        uint8 pct;
        uint256 slashed;
        uint256 unbondingSlashed;
        uint256 stakeAfter;
        uint64 penaltyUntil;
    }

    /// @dev Burns `r.pct` percent (rounded down) of the operator's active stake and of its
    /// unbonding amount, filling in `r.slashed`, `r.unbondingSlashed` and `r.stakeAfter`.
    function _slashStake(SlashRecord memory r) private {
        uint256 staked = stakes[r.operator];
        uint256 slashed = staked * r.pct / 100;
        uint256 stakeAfter = staked - slashed;
        stakes[r.operator] = stakeAfter;

        Unbonding storage u = _unbonding[r.operator];
        uint256 unbondingSlashed = u.amount * r.pct / 100;
        if (unbondingSlashed != 0) u.amount -= unbondingSlashed;

        uint256 burned = slashed + unbondingSlashed;
        if (burned != 0) _burn(address(this), burned);
        (r.slashed, r.unbondingSlashed, r.stakeAfter) = (slashed, unbondingSlashed, stakeAfter);
    }

    function _emitSlashed(SlashRecord memory r, bytes calldata evidence) private {
        emit Slashed(
            r.node,
            r.operator,
            r.evidenceHash,
            r.reporter,
            r.pct,
            r.slashed,
            r.unbondingSlashed,
            r.stakeAfter,
            r.penaltyUntil,
            evidence
        );
    }

    /// @dev Extends the penalty of `node` to at least `penaltyWindow` seconds from now.
    /// @return until The penalty's end after the extension, unix seconds.
    function _penalize(bytes32 node) private returns (uint64 until) {
        until = uint64(block.timestamp) + penaltyWindow;
        uint64 existing = penaltyUntil[node];
        if (until > existing) penaltyUntil[node] = until;
        else until = existing;
    }
}
