// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.30;

import {GYMToken} from "./GYMToken.sol";

/// @title Mining pool: per-epoch node rewards and the record of published models
/// @notice Holds GYM (funded by an ordinary ERC-20 transfer to its address) and pays it out to
/// the operators of the nodes that trained an epoch, once per (orchestrator, job, epoch), at an
/// orchestrator's call. Also keeps an append-only record of the model publications
/// orchestrators sign, once per (orchestrator, job, epoch).
/// @dev Amounts are in GYM wei; `Publication.timestamp` is in unix milliseconds. Job ids are
/// numbered by each orchestrator on its own, so everything keyed by a job is keyed by the
/// calling orchestrator's account too: two orchestrators sharing a pool never collide, and no
/// account can take (pay or record first) another orchestrator's (job, epoch).
contract MiningPool {
    /// @notice A published model, as signed off-chain by the orchestrator.
    /// @param job The training job.
    /// @param epoch The epoch of the job the model comes from.
    /// @param cid Content id of the model weights.
    /// @param configCid Content id of the model configuration.
    /// @param cardCid Content id of the model card.
    /// @param hfRepo The Hugging Face repository it was published to ("" when none).
    /// @param qualityBits The quality score, as the bits of an IEEE-754 binary64 (f64).
    /// @param timestamp Publication time, unix milliseconds.
    /// @param signer Ed25519 public key of the orchestrator that signed the record.
    /// @param signature 64-byte Ed25519 signature over the off-chain canonical record bytes.
    /// Not verified by this contract: readers verify it.
    struct Publication {
        uint64 job;
        uint32 epoch;
        string cid;
        string configCid;
        string cardCid;
        string hfRepo;
        uint64 qualityBits;
        uint64 timestamp;
        bytes32 signer;
        bytes signature;
    }

    /// @dev Where the i-th recorded publication is stored (one storage slot).
    struct PublicationKey {
        address orchestrator;
        uint64 job;
        uint32 epoch;
    }

    /// @notice The GYM token paid out, whose stakes say who is an orchestrator and which
    /// operator each node key is bound to.
    GYMToken public immutable token;

    /// @notice Whether the orchestrator account `orchestrator` has paid the rewards of its
    /// (job, epoch). Getter: `epochPaid(orchestrator, job, epoch)`.
    mapping(address => mapping(uint64 => mapping(uint32 => bool))) public epochPaid;

    /// @notice Cumulative rewards paid for a node key (to its operator at the time), GYM wei.
    mapping(bytes32 => uint256) public rewardsOf;

    mapping(address => mapping(uint64 => mapping(uint32 => Publication))) private _publications;
    PublicationKey[] private _publicationKeys;

    /// @notice `orchestrator` paid the rewards of (`job`, `epoch`): `amounts[i]` GYM wei to the
    /// operator of `nodes[i]`, `total` GYM wei in all.
    event EpochRewarded(
        uint64 indexed job,
        uint32 indexed epoch,
        address indexed orchestrator,
        bytes32[] nodes,
        uint256[] amounts,
        uint256 total
    );

    /// @notice `orchestrator` recorded the publication of (`job`, `epoch`), signed by `signer`,
    /// whose weights have content id `cid`.
    event PublicationRecorded(
        uint64 indexed job, uint32 indexed epoch, bytes32 indexed signer, address orchestrator, string cid
    );

    /// @notice `caller` is not an orchestrator (see `GYMToken.isOrchestrator`).
    error NotOrchestrator(address caller);
    /// @notice `nodes` and `amounts` differ in length.
    error LengthMismatch(uint256 nodes, uint256 amounts);
    /// @notice `orchestrator` already paid the rewards of its (`job`, `epoch`).
    error EpochAlreadyPaid(address orchestrator, uint64 job, uint32 epoch);
    /// @notice `node` is bound to no operator.
    error Unbound(bytes32 node);
    /// @notice A publication signature that is not 64 bytes long.
    error BadSignatureLength(uint256 length);
    /// @notice `orchestrator` already recorded the publication of its (`job`, `epoch`).
    error AlreadyRecorded(address orchestrator, uint64 job, uint32 epoch);
    /// @notice `orchestrator` recorded no publication for its (`job`, `epoch`).
    error NotRecorded(address orchestrator, uint64 job, uint32 epoch);
    /// @notice `index` is not below the number of publications, `count`.
    error IndexOutOfRange(uint256 index, uint256 count);

    /// @notice Deploys a pool paying out `token_`.
    /// @param token_ The GYM token.
    constructor(GYMToken token_) {
        token = token_;
    }

    /// @notice Pays the rewards of the caller's (`job`, `epoch`): `amounts[i]` GYM wei to the
    /// operator `nodes[i]` is bound to now. Once per (caller, job, epoch), marked in
    /// `epochPaid(msg.sender, job, epoch)`; an empty batch marks it paid. Another orchestrator's
    /// (job, epoch) with the same numbers is its own and unaffected. A node listed twice is paid
    /// both amounts. Reverts whole if any node is unbound or the pool holds too little GYM. Only
    /// an orchestrator may call this.
    /// @param job The training job (numbered by the calling orchestrator).
    /// @param epoch The epoch of the job.
    /// @param nodes Node keys to reward.
    /// @param amounts GYM wei for each node, same length as `nodes`.
    /// @return total GYM wei paid in all.
    function distributeEpochRewards(
        uint64 job,
        uint32 epoch,
        bytes32[] calldata nodes,
        uint256[] calldata amounts
    ) external returns (uint256 total) {
        GYMToken t = token;
        if (!t.isOrchestrator(msg.sender)) revert NotOrchestrator(msg.sender);
        if (nodes.length != amounts.length) revert LengthMismatch(nodes.length, amounts.length);
        mapping(uint32 => bool) storage paid = epochPaid[msg.sender][job];
        if (paid[epoch]) revert EpochAlreadyPaid(msg.sender, job, epoch);
        paid[epoch] = true;

        for (uint256 i = 0; i < nodes.length; ++i) {
            bytes32 node = nodes[i];
            uint256 amount = amounts[i];
            address op = t.nodeOperator(node);
            if (op == address(0)) revert Unbound(node);
            if (amount != 0) {
                rewardsOf[node] += amount;
                total += amount;
                // OpenZeppelin's ERC20 returns true or reverts (ERC20InsufficientBalance).
                t.transfer(op, amount);
            }
        }

        emit EpochRewarded(job, epoch, msg.sender, nodes, amounts, total);
    }

    /// @notice Records the publication of the caller's (`p.job`, `p.epoch`), once per
    /// (caller, job, epoch), and appends it to the ordered list (`publicationAt`), with the
    /// caller as its recorder (`publicationRecorder`). Only an orchestrator may call this. The
    /// signature's length is checked, not the signature.
    /// @param p The publication.
    function recordPublication(Publication calldata p) external {
        if (!token.isOrchestrator(msg.sender)) revert NotOrchestrator(msg.sender);
        if (p.signature.length != 64) revert BadSignatureLength(p.signature.length);
        if (isRecorded(msg.sender, p.job, p.epoch)) revert AlreadyRecorded(msg.sender, p.job, p.epoch);
        _publications[msg.sender][p.job][p.epoch] = p;
        _publicationKeys.push(PublicationKey(msg.sender, p.job, p.epoch));
        emit PublicationRecorded(p.job, p.epoch, p.signer, msg.sender, p.cid);
    }

    /// @notice Whether `orchestrator` recorded the publication of its (`job`, `epoch`).
    /// @param orchestrator The account that recorded it.
    /// @param job The training job.
    /// @param epoch The epoch.
    /// @return True when recorded.
    function isRecorded(address orchestrator, uint64 job, uint32 epoch) public view returns (bool) {
        // A recorded publication always has a 64-byte signature.
        return _publications[orchestrator][job][epoch].signature.length != 0;
    }

    /// @notice The publication `orchestrator` recorded for its (`job`, `epoch`); reverts
    /// `NotRecorded` when none.
    /// @param orchestrator The account that recorded it.
    /// @param job The training job.
    /// @param epoch The epoch.
    /// @return The publication.
    function publication(address orchestrator, uint64 job, uint32 epoch)
        external
        view
        returns (Publication memory)
    {
        if (!isRecorded(orchestrator, job, epoch)) revert NotRecorded(orchestrator, job, epoch);
        return _publications[orchestrator][job][epoch];
    }

    /// @notice How many publications are recorded, by all orchestrators together.
    /// @return The count.
    function publicationCount() external view returns (uint256) {
        return _publicationKeys.length;
    }

    /// @notice The `i`-th recorded publication, by any orchestrator, in the order recorded (from
    /// 0); reverts `IndexOutOfRange` when `i >= publicationCount()`. `publicationRecorder(i)`
    /// says which orchestrator account recorded it.
    /// @param i The index.
    /// @return The publication.
    function publicationAt(uint256 i) external view returns (Publication memory) {
        PublicationKey storage k = _key(i);
        return _publications[k.orchestrator][k.job][k.epoch];
    }

    /// @notice The orchestrator account that recorded the `i`-th publication (the
    /// `orchestrator` of its `PublicationRecorded` event); reverts `IndexOutOfRange` when
    /// `i >= publicationCount()`.
    /// @param i The index, as in `publicationAt`.
    /// @return The recording account.
    function publicationRecorder(uint256 i) external view returns (address) {
        return _key(i).orchestrator;
    }

    function _key(uint256 i) private view returns (PublicationKey storage) {
        uint256 n = _publicationKeys.length;
        if (i >= n) revert IndexOutOfRange(i, n);
        return _publicationKeys[i];
    }
}
