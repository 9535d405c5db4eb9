// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.30;

import {IERC20Errors} from "@openzeppelin/contracts/interfaces/draft-IERC6093.sol";
import {MiningPool} from "../src/MiningPool.sol";
import {Fixture} from "./utils/Fixture.sol";

contract MiningPoolTest is Fixture {
    uint256 internal constant POOL_FUNDS = 1_000_000 ether;

    function setUp() public override {
        super.setUp();
        fund(address(pool), POOL_FUNDS); // an ordinary ERC-20 transfer funds the pool
        bindAs(alice, NODE_A);
        bindAs(alice, NODE_B);
        bindAs(bob, NODE_C);
    }

    function test_deployment() public view {
        assertEq(address(pool.token()), address(token), "token");
        assertEq(token.balanceOf(address(pool)), POOL_FUNDS, "funded");
        assertFalse(pool.epochPaid(orch, 1, 1), "unpaid");
        assertEq(pool.rewardsOf(NODE_A), 0, "no rewards");
        assertEq(pool.publicationCount(), 0, "no publications");
    }

    // ---------------------------------------------------------------- distributeEpochRewards

    function test_distribute() public {
        bytes32[] memory nodes = three(NODE_A, NODE_B, NODE_C);
        uint256[] memory amounts = three(10 ether, 20 ether, 30 ether);

        vm.expectEmit(true, true, true, true, address(pool));
        emit MiningPool.EpochRewarded(7, 3, orch, nodes, amounts, 60 ether);
        vm.prank(orch);
        uint256 total = pool.distributeEpochRewards(7, 3, nodes, amounts);

        assertEq(total, 60 ether, "total");
        assertEq(token.balanceOf(alice), 30 ether, "alice paid for A and B");
        assertEq(token.balanceOf(bob), 30 ether, "bob paid for C");
        assertEq(token.balanceOf(address(pool)), POOL_FUNDS - 60 ether, "pool paid out");
        assertEq(pool.rewardsOf(NODE_A), 10 ether, "rewards A");
        assertEq(pool.rewardsOf(NODE_B), 20 ether, "rewards B");
        assertEq(pool.rewardsOf(NODE_C), 30 ether, "rewards C");
        assertTrue(pool.epochPaid(orch, 7, 3), "paid");
        assertFalse(pool.epochPaid(orch, 7, 4), "other epoch unpaid");
        assertFalse(pool.epochPaid(orch, 8, 3), "other job unpaid");
        assertFalse(pool.epochPaid(carol, 7, 3), "another orchestrator's (7, 3) unpaid");
    }

    function test_distribute_rewards_accumulate_across_epochs() public {
        vm.startPrank(orch);
        pool.distributeEpochRewards(1, 1, one(NODE_A), one(5 ether));
        pool.distributeEpochRewards(1, 2, one(NODE_A), one(7 ether));
        vm.stopPrank();
        assertEq(pool.rewardsOf(NODE_A), 12 ether, "cumulative");
        assertEq(token.balanceOf(alice), 12 ether, "paid");
    }

    function test_distribute_by_non_orchestrator_reverts() public {
        vm.expectRevert(abi.encodeWithSelector(MiningPool.NotOrchestrator.selector, alice));
        vm.prank(alice);
        pool.distributeEpochRewards(1, 1, one(NODE_A), one(1 ether));
    }

    function test_distribute_by_orchestrator_one_wei_short_reverts() public {
        stakeAs(carol, 50_000 ether - 1);
        vm.expectRevert(abi.encodeWithSelector(MiningPool.NotOrchestrator.selector, carol));
        vm.prank(carol);
        pool.distributeEpochRewards(1, 1, one(NODE_A), one(1 ether));
    }

    function test_distribute_length_mismatch_reverts() public {
        vm.expectRevert(abi.encodeWithSelector(MiningPool.LengthMismatch.selector, 2, 1));
        vm.prank(orch);
        pool.distributeEpochRewards(1, 1, two(NODE_A, NODE_B), one(1 ether));
    }

    function test_distribute_unbound_node_reverts_whole_batch() public {
        bytes32 stranger = keccak256("unbound node");
        vm.expectRevert(abi.encodeWithSelector(MiningPool.Unbound.selector, stranger));
        vm.prank(orch);
        pool.distributeEpochRewards(1, 1, three(NODE_A, stranger, NODE_C), three(1 ether, 2 ether, 3 ether));
        assertEq(token.balanceOf(alice), 0, "alice unpaid");
        assertEq(token.balanceOf(bob), 0, "bob unpaid");
        assertEq(token.balanceOf(address(pool)), POOL_FUNDS, "pool untouched");
        assertEq(pool.rewardsOf(NODE_A), 0, "no rewards recorded");
        assertFalse(pool.epochPaid(orch, 1, 1), "epoch still unpaid");
    }

    function test_distribute_same_epoch_twice_reverts() public {
        vm.prank(orch);
        pool.distributeEpochRewards(1, 1, one(NODE_A), one(1 ether));
        vm.expectRevert(
            abi.encodeWithSelector(MiningPool.EpochAlreadyPaid.selector, orch, uint64(1), uint32(1))
        );
        vm.prank(orch);
        pool.distributeEpochRewards(1, 1, one(NODE_C), one(1 ether));
        assertEq(token.balanceOf(bob), 0, "second batch unpaid");
    }

    function test_distribute_same_empty_epoch_twice_reverts() public {
        vm.prank(orch);
        pool.distributeEpochRewards(4, 2, new bytes32[](0), new uint256[](0));
        vm.expectRevert(
            abi.encodeWithSelector(MiningPool.EpochAlreadyPaid.selector, orch, uint64(4), uint32(2))
        );
        vm.prank(orch);
        pool.distributeEpochRewards(4, 2, new bytes32[](0), new uint256[](0));
    }

    function test_distribute_two_orchestrators_same_job_epoch_each_pay_once() public {
        // Job ids are numbered per orchestrator: both have a job 1 with an epoch 1.
        stakeAs(carol, 50_000 ether);
        vm.prank(orch);
        assertEq(pool.distributeEpochRewards(1, 1, one(NODE_A), one(1 ether)), 1 ether, "orch total");
        assertTrue(pool.epochPaid(orch, 1, 1), "orch paid");
        assertFalse(pool.epochPaid(carol, 1, 1), "carol not yet");

        bytes32[] memory nodes = one(NODE_C);
        uint256[] memory amounts = one(2 ether);
        vm.expectEmit(true, true, true, true, address(pool));
        emit MiningPool.EpochRewarded(1, 1, carol, nodes, amounts, 2 ether);
        vm.prank(carol);
        assertEq(pool.distributeEpochRewards(1, 1, nodes, amounts), 2 ether, "carol total");
        assertTrue(pool.epochPaid(carol, 1, 1), "carol paid");
        assertEq(token.balanceOf(alice), 1 ether, "orch's batch paid");
        assertEq(token.balanceOf(bob), 2 ether, "carol's batch paid");

        // Each once: a second payout by either reverts with its own account in the error.
        vm.expectRevert(
            abi.encodeWithSelector(MiningPool.EpochAlreadyPaid.selector, orch, uint64(1), uint32(1))
        );
        vm.prank(orch);
        pool.distributeEpochRewards(1, 1, one(NODE_A), one(1 ether));
        vm.expectRevert(
            abi.encodeWithSelector(MiningPool.EpochAlreadyPaid.selector, carol, uint64(1), uint32(1))
        );
        vm.prank(carol);
        pool.distributeEpochRewards(1, 1, one(NODE_C), one(2 ether));
        assertEq(token.balanceOf(address(pool)), POOL_FUNDS - 3 ether, "paid once each");
    }

    function test_distribute_cannot_squat_another_orchestrators_epoch() public {
        // A staked account paying (1, 1) first, even an empty batch, does not mark orch's (1, 1).
        stakeAs(carol, 50_000 ether);
        vm.prank(carol);
        pool.distributeEpochRewards(1, 1, new bytes32[](0), new uint256[](0));
        assertTrue(pool.epochPaid(carol, 1, 1), "carol's own (1, 1)");
        assertFalse(pool.epochPaid(orch, 1, 1), "orch's (1, 1) untouched");
        vm.prank(orch);
        assertEq(pool.distributeEpochRewards(1, 1, one(NODE_A), one(1 ether)), 1 ether, "orch still pays");
        assertEq(token.balanceOf(alice), 1 ether, "paid");
    }

    function test_distribute_other_job_same_epoch_pays() public {
        vm.prank(orch);
        pool.distributeEpochRewards(1, 1, one(NODE_A), one(1 ether));
        vm.prank(orch);
        assertEq(pool.distributeEpochRewards(2, 1, one(NODE_A), one(2 ether)), 2 ether, "total");
        assertEq(token.balanceOf(alice), 3 ether, "paid twice");
        assertTrue(pool.epochPaid(orch, 2, 1), "paid");
    }

    function test_distribute_duplicates_paid_twice() public {
        vm.prank(orch);
        uint256 total = pool.distributeEpochRewards(1, 1, two(NODE_C, NODE_C), two(4 ether, 6 ether));
        assertEq(total, 10 ether, "total");
        assertEq(token.balanceOf(bob), 10 ether, "both amounts");
        assertEq(pool.rewardsOf(NODE_C), 10 ether, "both recorded");
    }

    function test_distribute_pool_too_poor_reverts_all() public {
        uint256[] memory amounts = two(1 ether, POOL_FUNDS);
        vm.expectRevert(
            abi.encodeWithSelector(
                IERC20Errors.ERC20InsufficientBalance.selector, address(pool), POOL_FUNDS - 1 ether, POOL_FUNDS
            )
        );
        vm.prank(orch);
        pool.distributeEpochRewards(1, 1, two(NODE_A, NODE_C), amounts);
        assertEq(token.balanceOf(alice), 0, "first transfer undone");
        assertEq(token.balanceOf(address(pool)), POOL_FUNDS, "pool untouched");
        assertEq(pool.rewardsOf(NODE_A), 0, "no rewards recorded");
        assertFalse(pool.epochPaid(orch, 1, 1), "epoch still unpaid");
    }

    function test_distribute_exactly_the_pool_balance() public {
        vm.prank(orch);
        pool.distributeEpochRewards(1, 1, one(NODE_C), one(POOL_FUNDS));
        assertEq(token.balanceOf(address(pool)), 0, "emptied");
        assertEq(token.balanceOf(bob), POOL_FUNDS, "paid");
    }

    function test_distribute_empty_batch() public {
        bytes32[] memory nodes = new bytes32[](0);
        uint256[] memory amounts = new uint256[](0);
        vm.expectEmit(true, true, true, true, address(pool));
        emit MiningPool.EpochRewarded(5, 9, orch, nodes, amounts, 0);
        vm.prank(orch);
        assertEq(pool.distributeEpochRewards(5, 9, nodes, amounts), 0, "total");
        assertTrue(pool.epochPaid(orch, 5, 9), "marked paid");
    }

    function test_distribute_zero_amount_skips_transfer() public {
        vm.recordLogs();
        vm.prank(orch);
        uint256 total = pool.distributeEpochRewards(1, 1, two(NODE_A, NODE_C), two(uint256(0), 3 ether));
        assertEq(total, 3 ether, "total");
        assertEq(token.balanceOf(alice), 0, "nothing to alice");
        assertEq(pool.rewardsOf(NODE_A), 0, "no reward recorded");
        // One ERC-20 Transfer (to bob) and the EpochRewarded event: no zero-value transfer.
        assertEq(vm.getRecordedLogs().length, 2, "logs");
    }

    function test_distribute_zero_amount_still_needs_a_bound_node() public {
        bytes32 stranger = keccak256("unbound node");
        vm.expectRevert(abi.encodeWithSelector(MiningPool.Unbound.selector, stranger));
        vm.prank(orch);
        pool.distributeEpochRewards(1, 1, one(stranger), one(uint256(0)));
    }

    function test_distribute_pays_the_current_operator() public {
        vm.prank(alice);
        token.unbindNode(NODE_A);
        bindAs(carol, NODE_A);
        vm.prank(orch);
        pool.distributeEpochRewards(1, 1, one(NODE_A), one(1 ether));
        assertEq(token.balanceOf(carol), 1 ether, "current operator paid");
        assertEq(token.balanceOf(alice), 0, "former operator not");
    }

    // ---------------------------------------------------------------- publications

    function assertPublication(MiningPool.Publication memory a, MiningPool.Publication memory b) internal pure {
        assertEq(uint256(a.job), uint256(b.job), "job");
        assertEq(uint256(a.epoch), uint256(b.epoch), "epoch");
        assertEq(a.cid, b.cid, "cid");
        assertEq(a.configCid, b.configCid, "configCid");
        assertEq(a.cardCid, b.cardCid, "cardCid");
        assertEq(a.hfRepo, b.hfRepo, "hfRepo");
        assertEq(uint256(a.qualityBits), uint256(b.qualityBits), "qualityBits");
        assertEq(uint256(a.timestamp), uint256(b.timestamp), "timestamp");
        assertEq(a.signer, b.signer, "signer");
        assertEq(a.signature, b.signature, "signature");
    }

    function test_recordPublication() public {
        MiningPool.Publication memory p = publicationFixture(7, 3);
        vm.expectEmit(true, true, true, true, address(pool));
        emit MiningPool.PublicationRecorded(7, 3, p.signer, orch, p.cid);
        vm.prank(orch);
        pool.recordPublication(p);

        assertTrue(pool.isRecorded(orch, 7, 3), "recorded");
        assertFalse(pool.isRecorded(orch, 7, 4), "other epoch not");
        assertFalse(pool.isRecorded(orch, 8, 3), "other job not");
        assertFalse(pool.isRecorded(carol, 7, 3), "another orchestrator's (7, 3) not");
        assertEq(pool.publicationCount(), 1, "count");
        assertPublication(pool.publication(orch, 7, 3), p);
        assertPublication(pool.publicationAt(0), p);
        assertEq(pool.publicationRecorder(0), orch, "recorder");
    }

    function test_recordPublication_empty_strings() public {
        MiningPool.Publication memory p = publicationFixture(0, 0);
        (p.cid, p.configCid, p.cardCid, p.hfRepo, p.signer) = ("", "", "", "", bytes32(0));
        vm.prank(orch);
        pool.recordPublication(p);
        assertTrue(pool.isRecorded(orch, 0, 0), "recorded");
        assertPublication(pool.publication(orch, 0, 0), p);
    }

    function test_recordPublication_keeps_order() public {
        MiningPool.Publication memory p1 = publicationFixture(2, 5);
        MiningPool.Publication memory p2 = publicationFixture(1, 7);
        p2.cid = "bafkreisecond";
        MiningPool.Publication memory p3 = publicationFixture(2, 6);
        p3.hfRepo = "";
        vm.startPrank(orch);
        pool.recordPublication(p1);
        pool.recordPublication(p2);
        pool.recordPublication(p3);
        vm.stopPrank();
        assertEq(pool.publicationCount(), 3, "count");
        assertPublication(pool.publicationAt(0), p1);
        assertPublication(pool.publicationAt(1), p2);
        assertPublication(pool.publicationAt(2), p3);
        assertPublication(pool.publication(orch, 1, 7), p2);
        for (uint256 i = 0; i < 3; ++i) {
            assertEq(pool.publicationRecorder(i), orch, "recorder");
        }
    }

    function test_recordPublication_two_orchestrators_same_job_epoch() public {
        stakeAs(carol, 50_000 ether);
        MiningPool.Publication memory mine = publicationFixture(1, 1);
        MiningPool.Publication memory theirs = publicationFixture(1, 1);
        theirs.cid = "bafkreicarols";
        theirs.signer = keccak256("carol ed25519 key");

        vm.prank(orch);
        pool.recordPublication(mine);
        assertTrue(pool.isRecorded(orch, 1, 1), "orch recorded");
        assertFalse(pool.isRecorded(carol, 1, 1), "carol not yet");
        vm.expectRevert(abi.encodeWithSelector(MiningPool.NotRecorded.selector, carol, uint64(1), uint32(1)));
        pool.publication(carol, 1, 1);

        vm.expectEmit(true, true, true, true, address(pool));
        emit MiningPool.PublicationRecorded(1, 1, theirs.signer, carol, theirs.cid);
        vm.prank(carol);
        pool.recordPublication(theirs);

        assertTrue(pool.isRecorded(carol, 1, 1), "carol recorded");
        assertPublication(pool.publication(orch, 1, 1), mine);
        assertPublication(pool.publication(carol, 1, 1), theirs);
        assertEq(pool.publicationCount(), 2, "one global list");
        assertPublication(pool.publicationAt(0), mine);
        assertPublication(pool.publicationAt(1), theirs);
        assertEq(pool.publicationRecorder(0), orch, "recorder 0");
        assertEq(pool.publicationRecorder(1), carol, "recorder 1");

        // Each once, the error naming the caller.
        vm.expectRevert(abi.encodeWithSelector(MiningPool.AlreadyRecorded.selector, carol, uint64(1), uint32(1)));
        vm.prank(carol);
        pool.recordPublication(theirs);
        assertEq(pool.publicationCount(), 2, "count unchanged");
    }

    function test_recordPublication_duplicate_reverts() public {
        vm.prank(orch);
        pool.recordPublication(publicationFixture(7, 3));
        MiningPool.Publication memory again = publicationFixture(7, 3);
        again.cid = "bafkreidifferent";
        vm.expectRevert(abi.encodeWithSelector(MiningPool.AlreadyRecorded.selector, orch, uint64(7), uint32(3)));
        vm.prank(orch);
        pool.recordPublication(again);
        assertEq(pool.publicationCount(), 1, "count");
        assertEq(pool.publication(orch, 7, 3).cid, publicationFixture(7, 3).cid, "first kept");
    }

    function test_recordPublication_bad_signature_length_reverts() public {
        uint256[4] memory lengths = [uint256(0), 63, 65, 128];
        for (uint256 i = 0; i < lengths.length; ++i) {
            MiningPool.Publication memory p = publicationFixture(7, 3);
            p.signature = new bytes(lengths[i]);
            vm.expectRevert(abi.encodeWithSelector(MiningPool.BadSignatureLength.selector, lengths[i]));
            vm.prank(orch);
            pool.recordPublication(p);
        }
        assertFalse(pool.isRecorded(orch, 7, 3), "not recorded");
    }

    function test_recordPublication_by_non_orchestrator_reverts() public {
        vm.expectRevert(abi.encodeWithSelector(MiningPool.NotOrchestrator.selector, alice));
        vm.prank(alice);
        pool.recordPublication(publicationFixture(7, 3));
    }

    function test_publication_not_recorded_reverts() public {
        vm.expectRevert(abi.encodeWithSelector(MiningPool.NotRecorded.selector, orch, uint64(7), uint32(3)));
        pool.publication(orch, 7, 3);
        vm.prank(orch);
        pool.recordPublication(publicationFixture(7, 3));
        vm.expectRevert(abi.encodeWithSelector(MiningPool.NotRecorded.selector, carol, uint64(7), uint32(3)));
        pool.publication(carol, 7, 3);
    }

    function test_publicationAt_out_of_range_reverts() public {
        vm.expectRevert(abi.encodeWithSelector(MiningPool.IndexOutOfRange.selector, 0, 0));
        pool.publicationAt(0);
        vm.prank(orch);
        pool.recordPublication(publicationFixture(7, 3));
        vm.expectRevert(abi.encodeWithSelector(MiningPool.IndexOutOfRange.selector, 1, 1));
        pool.publicationAt(1);
    }

    function test_publicationRecorder_out_of_range_reverts() public {
        vm.expectRevert(abi.encodeWithSelector(MiningPool.IndexOutOfRange.selector, 0, 0));
        pool.publicationRecorder(0);
        vm.prank(orch);
        pool.recordPublication(publicationFixture(7, 3));
        vm.expectRevert(abi.encodeWithSelector(MiningPool.IndexOutOfRange.selector, 1, 1));
        pool.publicationRecorder(1);
    }
}
