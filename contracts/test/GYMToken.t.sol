// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.30;

import {IERC20Errors} from "@openzeppelin/contracts/interfaces/draft-IERC6093.sol";
import {GYMToken} from "../src/GYMToken.sol";
import {Fixture} from "./utils/Fixture.sol";

contract GYMTokenTest is Fixture {
    // ---------------------------------------------------------------- deployment

    function test_deployment() public view {
        assertEq(token.name(), "Gym", "name");
        assertEq(token.symbol(), "GYM", "symbol");
        assertEq(uint256(token.decimals()), 18, "decimals");
        assertEq(token.totalSupply(), SUPPLY, "supply");
        assertEq(token.balanceOf(address(this)), SUPPLY - 50_000 ether, "holder balance");
        assertEq(token.NODE_MIN_STAKE(), 10_000 ether, "node min");
        assertEq(token.ORCHESTRATOR_MIN_STAKE(), 50_000 ether, "orchestrator min");
        assertEq(uint256(token.unbondingDelay()), UNBONDING, "unbonding delay");
        assertEq(uint256(token.penaltyWindow()), PENALTY, "penalty window");
    }

    function test_constructor_mints_to_holder() public {
        GYMToken t = new GYMToken(alice, 123, 1, 2);
        assertEq(t.balanceOf(alice), 123, "holder");
        assertEq(t.totalSupply(), 123, "supply");
    }

    // ---------------------------------------------------------------- stake

    function test_stake() public {
        fund(alice, 1_000 ether);
        vm.expectEmit(true, false, false, true, address(token));
        emit GYMToken.Staked(alice, 400 ether, 400 ether);
        vm.prank(alice);
        token.stake(400 ether);
        assertEq(token.stakes(alice), 400 ether, "stake");
        assertEq(token.balanceOf(alice), 600 ether, "balance");
        assertEq(token.balanceOf(address(token)), 50_000 ether + 400 ether, "held");

        vm.expectEmit(true, false, false, true, address(token));
        emit GYMToken.Staked(alice, 100 ether, 500 ether);
        vm.prank(alice);
        token.stake(100 ether);
        assertEq(token.stakes(alice), 500 ether, "stake accumulates");
        assertEq(token.totalSupply(), SUPPLY, "supply unchanged");
    }

    function test_stake_zero_reverts() public {
        fund(alice, 1 ether);
        vm.expectRevert(GYMToken.ZeroAmount.selector);
        vm.prank(alice);
        token.stake(0);
    }

    function test_stake_more_than_balance_reverts() public {
        fund(alice, 1 ether);
        vm.expectRevert(
            abi.encodeWithSelector(IERC20Errors.ERC20InsufficientBalance.selector, alice, 1 ether, 1 ether + 1)
        );
        vm.prank(alice);
        token.stake(1 ether + 1);
    }

    // ---------------------------------------------------------------- unstake / withdraw

    function test_unstake() public {
        stakeAs(alice, 100 ether);
        vm.expectEmit(true, false, false, true, address(token));
        emit GYMToken.UnstakeRequested(alice, 40 ether, uint64(T0) + UNBONDING);
        vm.prank(alice);
        token.unstake(40 ether);
        assertEq(token.stakes(alice), 60 ether, "active");
        (uint256 amount, uint64 unlockAt) = token.unbonding(alice);
        assertEq(amount, 40 ether, "pending");
        assertEq(uint256(unlockAt), T0 + UNBONDING, "unlockAt");
        assertEq(token.balanceOf(alice), 0, "still held by the contract");
    }

    function test_unstake_all() public {
        stakeAs(alice, 100 ether);
        vm.prank(alice);
        token.unstake(100 ether);
        assertEq(token.stakes(alice), 0, "active");
    }

    function test_unstake_zero_reverts() public {
        stakeAs(alice, 100 ether);
        vm.expectRevert(GYMToken.ZeroAmount.selector);
        vm.prank(alice);
        token.unstake(0);
    }

    function test_unstake_more_than_stake_reverts() public {
        stakeAs(alice, 100 ether);
        vm.expectRevert(abi.encodeWithSelector(GYMToken.InsufficientStake.selector, 100 ether, 100 ether + 1));
        vm.prank(alice);
        token.unstake(100 ether + 1);
    }

    function test_unstake_without_stake_reverts() public {
        vm.expectRevert(abi.encodeWithSelector(GYMToken.InsufficientStake.selector, 0, 1));
        vm.prank(bob);
        token.unstake(1);
    }

    function test_second_unstake_moves_unlock_for_whole_amount() public {
        stakeAs(alice, 100 ether);
        vm.prank(alice);
        token.unstake(10 ether);
        vm.warp(T0 + 1 days);
        vm.prank(alice);
        token.unstake(20 ether);
        (uint256 amount, uint64 unlockAt) = token.unbonding(alice);
        assertEq(amount, 30 ether, "pending adds up");
        assertEq(uint256(unlockAt), T0 + 1 days + UNBONDING, "unlock restarts");
        vm.warp(T0 + UNBONDING); // the first request's unlock time
        vm.expectRevert(abi.encodeWithSelector(GYMToken.StillUnbonding.selector, uint64(T0 + 1 days + UNBONDING)));
        vm.prank(alice);
        token.withdraw();
    }

    function test_withdraw_after_delay() public {
        stakeAs(alice, 100 ether);
        vm.prank(alice);
        token.unstake(40 ether);
        uint64 unlockAt = uint64(T0) + UNBONDING;

        vm.expectRevert(abi.encodeWithSelector(GYMToken.StillUnbonding.selector, unlockAt));
        vm.prank(alice);
        token.withdraw();

        vm.warp(unlockAt - 1);
        vm.expectRevert(abi.encodeWithSelector(GYMToken.StillUnbonding.selector, unlockAt));
        vm.prank(alice);
        token.withdraw();

        vm.warp(unlockAt);
        vm.expectEmit(true, false, false, true, address(token));
        emit GYMToken.Withdrawn(alice, 40 ether);
        vm.prank(alice);
        token.withdraw();
        assertEq(token.balanceOf(alice), 40 ether, "returned");
        assertEq(token.stakes(alice), 60 ether, "active untouched");
        (uint256 amount, uint64 at) = token.unbonding(alice);
        assertEq(amount, 0, "pending cleared");
        assertEq(uint256(at), 0, "unlock cleared");

        vm.expectRevert(GYMToken.NothingToWithdraw.selector);
        vm.prank(alice);
        token.withdraw();
    }

    function test_withdraw_nothing_reverts() public {
        vm.expectRevert(GYMToken.NothingToWithdraw.selector);
        vm.prank(alice);
        token.withdraw();
    }

    function test_unbonding_of_stranger_is_zero() public view {
        (uint256 amount, uint64 unlockAt) = token.unbonding(carol);
        assertEq(amount, 0, "amount");
        assertEq(uint256(unlockAt), 0, "unlockAt");
    }

    // ---------------------------------------------------------------- bind / unbind

    function test_bind() public {
        vm.expectEmit(true, true, false, true, address(token));
        emit GYMToken.NodeBound(NODE_A, alice);
        bindAs(alice, NODE_A);
        assertEq(token.nodeOperator(NODE_A), alice, "operator");
    }

    function test_bind_zero_key_reverts() public {
        vm.expectRevert(GYMToken.ZeroNodeKey.selector);
        vm.prank(alice);
        token.bindNode(bytes32(0));
    }

    function test_rebind_by_same_operator() public {
        bindAs(alice, NODE_A);
        vm.expectEmit(true, true, false, true, address(token));
        emit GYMToken.NodeBound(NODE_A, alice);
        bindAs(alice, NODE_A);
        assertEq(token.nodeOperator(NODE_A), alice, "operator");
    }

    function test_bind_bound_to_other_reverts() public {
        bindAs(alice, NODE_A);
        vm.expectRevert(abi.encodeWithSelector(GYMToken.NodeBoundToOther.selector, NODE_A, alice));
        vm.prank(bob);
        token.bindNode(NODE_A);
        assertEq(token.nodeOperator(NODE_A), alice, "unchanged");
    }

    function test_unbind() public {
        bindAs(alice, NODE_A);
        vm.expectEmit(true, true, false, true, address(token));
        emit GYMToken.NodeUnbound(NODE_A, alice);
        vm.prank(alice);
        token.unbindNode(NODE_A);
        assertEq(token.nodeOperator(NODE_A), address(0), "cleared");
        assertEq(token.formerOperator(NODE_A), alice, "former operator recorded");
        bindAs(bob, NODE_A); // free for anyone now
        assertEq(token.nodeOperator(NODE_A), bob, "rebound");
        assertEq(token.formerOperator(NODE_A), alice, "former operator kept on rebinding");
        vm.prank(bob);
        token.unbindNode(NODE_A);
        assertEq(token.formerOperator(NODE_A), bob, "the last to unbind");
    }

    function test_formerOperator_of_never_unbound_key_is_zero() public {
        assertEq(token.formerOperator(NODE_A), address(0), "never bound");
        bindAs(alice, NODE_A);
        assertEq(token.formerOperator(NODE_A), address(0), "bound, never unbound");
    }

    function test_unbind_by_non_operator_reverts() public {
        bindAs(alice, NODE_A);
        vm.expectRevert(abi.encodeWithSelector(GYMToken.NotNodeOperator.selector, NODE_A, bob));
        vm.prank(bob);
        token.unbindNode(NODE_A);
        assertEq(token.nodeOperator(NODE_A), alice, "unchanged");
        assertEq(token.formerOperator(NODE_A), address(0), "no former operator");
    }

    function test_unbind_unbound_reverts() public {
        vm.expectRevert(abi.encodeWithSelector(GYMToken.NotNodeOperator.selector, NODE_B, alice));
        vm.prank(alice);
        token.unbindNode(NODE_B);
    }

    function test_unbind_keeps_penalty() public {
        stakeAs(alice, 10_000 ether);
        bindAs(alice, NODE_A);
        vm.prank(orch);
        token.slash(NODE_A, 10, carol, "evidence");
        vm.prank(alice);
        token.unbindNode(NODE_A);
        assertEq(uint256(token.penaltyUntil(NODE_A)), T0 + PENALTY, "penalty stays");
        bindAs(bob, NODE_A);
        (address op, uint256 s, uint64 until) = token.nodeStake(NODE_A);
        assertEq(op, bob, "new operator");
        assertEq(s, 0, "bob has no stake");
        assertEq(uint256(until), T0 + PENALTY, "penalty follows the key");
    }

    // ---------------------------------------------------------------- views

    function test_nodeStake() public {
        (address op, uint256 s, uint64 until) = token.nodeStake(NODE_A);
        assertEq(op, address(0), "unbound operator");
        assertEq(s, 0, "unbound stake");
        assertEq(uint256(until), 0, "no penalty");

        stakeAs(alice, 12_345 ether);
        bindAs(alice, NODE_A);
        (op, s, until) = token.nodeStake(NODE_A);
        assertEq(op, alice, "operator");
        assertEq(s, 12_345 ether, "stake");
        assertEq(uint256(until), 0, "no penalty");

        vm.prank(alice);
        token.unstake(345 ether);
        (, s,) = token.nodeStake(NODE_A);
        assertEq(s, 12_000 ether, "active stake only");

        vm.prank(alice);
        token.unbindNode(NODE_A);
        (op, s,) = token.nodeStake(NODE_A);
        assertEq(op, address(0), "unbound again");
        assertEq(s, 0, "unbound: stake 0 though the operator has stake");
    }

    function test_isOrchestrator_threshold() public {
        assertTrue(token.isOrchestrator(orch), "exactly the minimum");
        stakeAs(alice, 50_000 ether - 1);
        assertFalse(token.isOrchestrator(alice), "one wei short");
        stakeAs(alice, 1);
        assertTrue(token.isOrchestrator(alice), "topped up");
        vm.prank(alice);
        token.unstake(1);
        assertFalse(token.isOrchestrator(alice), "unbonding stake does not count");
        assertFalse(token.isOrchestrator(address(0)), "zero address");
    }

    // ---------------------------------------------------------------- slash

    function _slashable() internal {
        stakeAs(alice, 10_000 ether);
        bindAs(alice, NODE_A);
    }

    function test_slash() public {
        _slashable();
        bytes memory ev = "double-signed gradient commitment";
        uint256 supplyBefore = token.totalSupply();
        uint256 orchBalance = token.balanceOf(orch);

        vm.expectEmit(true, true, true, true, address(token));
        emit GYMToken.Slashed(
            NODE_A, alice, sha256(ev), carol, 25, 2_500 ether, 0, 7_500 ether, uint64(T0) + PENALTY, ev
        );
        vm.prank(orch);
        uint256 slashed = token.slash(NODE_A, 25, carol, ev);

        assertEq(slashed, 2_500 ether, "returned");
        assertEq(token.stakes(alice), 7_500 ether, "stake after");
        assertEq(token.totalSupply(), supplyBefore - 2_500 ether, "burned");
        assertEq(token.balanceOf(address(token)), 50_000 ether + 7_500 ether, "contract holds the rest");
        assertEq(token.balanceOf(orch), orchBalance, "no bounty to the orchestrator");
        assertEq(token.balanceOf(carol), 0, "no bounty to the reporter");
        assertEq(uint256(token.penaltyUntil(NODE_A)), T0 + PENALTY, "penalty");
        assertTrue(token.evidenceUsed(sha256(ev)), "evidence used, by sha256");
        assertFalse(token.evidenceUsed(keccak256(ev)), "not keyed by keccak");
    }

    function test_slash_by_non_orchestrator_reverts() public {
        _slashable();
        vm.expectRevert(abi.encodeWithSelector(GYMToken.NotOrchestrator.selector, bob));
        vm.prank(bob);
        token.slash(NODE_A, 10, carol, "e");
    }

    function test_slash_by_orchestrator_one_wei_short_reverts() public {
        _slashable();
        stakeAs(bob, 50_000 ether - 1);
        vm.expectRevert(abi.encodeWithSelector(GYMToken.NotOrchestrator.selector, bob));
        vm.prank(bob);
        token.slash(NODE_A, 10, carol, "e");
    }

    function test_slash_by_orchestrator_with_exact_minimum() public {
        _slashable();
        assertEq(token.stakes(orch), 50_000 ether, "exactly 50,000 GYM");
        vm.prank(orch);
        assertEq(token.slash(NODE_A, 10, carol, "e"), 1_000 ether, "slashed");
    }

    function test_slash_pct_zero_reverts() public {
        _slashable();
        vm.expectRevert(abi.encodeWithSelector(GYMToken.BadPercentage.selector, uint8(0)));
        vm.prank(orch);
        token.slash(NODE_A, 0, carol, "e");
    }

    function test_slash_pct_101_reverts() public {
        _slashable();
        vm.expectRevert(abi.encodeWithSelector(GYMToken.BadPercentage.selector, uint8(101)));
        vm.prank(orch);
        token.slash(NODE_A, 101, carol, "e");
    }

    function test_slash_pct_100_takes_everything() public {
        _slashable();
        vm.prank(orch);
        assertEq(token.slash(NODE_A, 100, carol, "e"), 10_000 ether, "all");
        assertEq(token.stakes(alice), 0, "nothing left");
    }

    function test_slash_zero_reporter_reverts() public {
        _slashable();
        vm.expectRevert(GYMToken.ZeroReporter.selector);
        vm.prank(orch);
        token.slash(NODE_A, 10, address(0), "e");
    }

    function test_slash_empty_evidence_reverts() public {
        _slashable();
        vm.expectRevert(GYMToken.EmptyEvidence.selector);
        vm.prank(orch);
        token.slash(NODE_A, 10, carol, "");
    }

    function test_slash_unbound_node_reverts() public {
        // NODE_B was never bound: no current and no former operator.
        _slashable();
        vm.expectRevert(abi.encodeWithSelector(GYMToken.Unbound.selector, NODE_B));
        vm.prank(orch);
        token.slash(NODE_B, 10, carol, "e");
        assertFalse(token.evidenceUsed(sha256(bytes("e"))), "evidence not used");
    }

    function test_slash_after_unbind_hits_the_former_operator() public {
        // The offence happens while bound; the operator unbinds before the slash lands.
        stakeAs(alice, 1_000 ether);
        bindAs(alice, NODE_A);
        vm.prank(alice);
        token.unstake(400 ether);
        vm.prank(alice);
        token.unbindNode(NODE_A);
        uint256 supplyBefore = token.totalSupply();

        bytes memory ev = "offence while bound";
        vm.expectEmit(true, true, true, true, address(token));
        emit GYMToken.Slashed(
            NODE_A, alice, sha256(ev), carol, 50, 300 ether, 200 ether, 300 ether, uint64(T0) + PENALTY, ev
        );
        vm.prank(orch);
        uint256 slashed = token.slash(NODE_A, 50, carol, ev);

        assertEq(slashed, 300 ether, "returned");
        assertEq(token.stakes(alice), 300 ether, "active stake reduced");
        (uint256 pending,) = token.unbonding(alice);
        assertEq(pending, 200 ether, "unbonding reduced");
        assertEq(token.totalSupply(), supplyBefore - 500 ether, "burned");
        assertEq(uint256(token.penaltyUntil(NODE_A)), T0 + PENALTY, "key penalized");
        assertEq(token.nodeOperator(NODE_A), address(0), "still unbound");
        (address op,,) = token.nodeStake(NODE_A);
        assertEq(op, address(0), "nodeStake: unbound");
    }

    function test_slash_after_rebind_hits_the_current_operator() public {
        // Once another operator binds the key, a slash hits it (current operator first), not the
        // former one.
        stakeAs(alice, 10_000 ether);
        stakeAs(bob, 10_000 ether);
        bindAs(alice, NODE_A);
        vm.prank(alice);
        token.unbindNode(NODE_A);
        bindAs(bob, NODE_A);

        bytes memory ev = "e";
        vm.expectEmit(true, true, true, true, address(token));
        emit GYMToken.Slashed(NODE_A, bob, sha256(ev), carol, 10, 1_000 ether, 0, 9_000 ether, uint64(T0) + PENALTY, ev);
        vm.prank(orch);
        token.slash(NODE_A, 10, carol, ev);
        assertEq(token.stakes(bob), 9_000 ether, "current operator slashed");
        assertEq(token.stakes(alice), 10_000 ether, "former operator untouched");
        assertEq(token.formerOperator(NODE_A), alice, "former operator still recorded");

        // Bob unbinds too: the key's former operator is now bob, who is hit next.
        vm.prank(bob);
        token.unbindNode(NODE_A);
        vm.prank(orch);
        token.slash(NODE_A, 10, carol, "e2");
        assertEq(token.stakes(bob), 8_100 ether, "the last to unbind slashed");
        assertEq(token.stakes(alice), 10_000 ether, "alice still untouched");
    }

    function test_slash_reused_evidence_reverts() public {
        _slashable();
        bindAs(alice, NODE_B);
        vm.prank(orch);
        token.slash(NODE_A, 10, carol, "same");
        // Same evidence, even against another node or by another orchestrator.
        stakeAs(bob, 50_000 ether);
        vm.expectRevert(abi.encodeWithSelector(GYMToken.EvidenceUsed.selector, sha256(bytes("same"))));
        vm.prank(bob);
        token.slash(NODE_B, 10, carol, "same");
        assertEq(token.stakes(alice), 9_000 ether, "slashed once");
    }

    function test_slash_rounds_down() public {
        stakeAs(alice, 10_000 ether + 199);
        bindAs(alice, NODE_A);
        vm.prank(orch);
        uint256 slashed = token.slash(NODE_A, 1, carol, "e");
        assertEq(slashed, 100 ether + 1, "floor((10000e18 + 199) / 100)");
        assertEq(token.stakes(alice), 9_900 ether + 198, "rest");

        stakeAs(bob, 99); // 99 wei * 1% rounds to 0
        bindAs(bob, NODE_B);
        vm.prank(orch);
        assertEq(token.slash(NODE_B, 1, carol, "e2"), 0, "rounds to zero");
        assertEq(token.stakes(bob), 99, "untouched");
        assertEq(uint256(token.penaltyUntil(NODE_B)), T0 + PENALTY, "penalized all the same");
    }

    function test_slash_operator_without_stake() public {
        bindAs(bob, NODE_B);
        uint256 supplyBefore = token.totalSupply();
        vm.prank(orch);
        assertEq(token.slash(NODE_B, 50, carol, "e"), 0, "nothing to slash");
        assertEq(token.totalSupply(), supplyBefore, "nothing burned");
        assertEq(uint256(token.penaltyUntil(NODE_B)), T0 + PENALTY, "penalized");
        assertTrue(token.evidenceUsed(sha256(bytes("e"))), "evidence used");
    }

    function test_slash_penalty_extends_with_later_slash() public {
        _slashable();
        vm.prank(orch);
        token.slash(NODE_A, 1, carol, "e1");
        vm.warp(T0 + 12 hours);
        vm.prank(orch);
        token.slash(NODE_A, 1, carol, "e2");
        assertEq(uint256(token.penaltyUntil(NODE_A)), T0 + 12 hours + PENALTY, "later end wins");
    }

    function test_slash_penalty_keeps_the_later_end() public {
        // A second slash whose window would end sooner (here: a block with an earlier timestamp)
        // keeps the end already recorded, and the event reports that end.
        _slashable();
        vm.warp(T0 + 1 hours);
        vm.prank(orch);
        token.slash(NODE_A, 1, carol, "e1");
        uint64 end = uint64(T0 + 1 hours) + PENALTY;
        vm.warp(T0);
        bytes memory ev = "e2";
        vm.expectEmit(true, true, true, true, address(token));
        emit GYMToken.Slashed(NODE_A, alice, sha256(ev), carol, 1, 99 ether, 0, 9_801 ether, end, ev);
        vm.prank(orch);
        token.slash(NODE_A, 1, carol, ev);
        assertEq(uint256(token.penaltyUntil(NODE_A)), end, "kept");
    }

    function test_slash_also_slashes_unbonding() public {
        stakeAs(alice, 1_000 ether);
        bindAs(alice, NODE_A);
        vm.prank(alice);
        token.unstake(400 ether);
        uint256 supplyBefore = token.totalSupply();

        bytes memory ev = "e";
        vm.expectEmit(true, true, true, true, address(token));
        emit GYMToken.Slashed(NODE_A, alice, sha256(ev), carol, 50, 300 ether, 200 ether, 300 ether, uint64(T0) + PENALTY, ev);
        vm.prank(orch);
        uint256 slashed = token.slash(NODE_A, 50, carol, ev);

        assertEq(slashed, 300 ether, "from the active stake");
        assertEq(token.stakes(alice), 300 ether, "active after");
        (uint256 pending, uint64 unlockAt) = token.unbonding(alice);
        assertEq(pending, 200 ether, "unbonding after");
        assertEq(uint256(unlockAt), T0 + UNBONDING, "unlock unchanged");
        assertEq(token.totalSupply(), supplyBefore - 500 ether, "both burned");

        vm.warp(unlockAt);
        vm.prank(alice);
        token.withdraw();
        assertEq(token.balanceOf(alice), 200 ether, "withdraws what is left");
        assertEq(token.balanceOf(address(token)), 50_000 ether + 300 ether, "contract still backs every stake");
    }

    function test_slash_fully_unstaked_operator_still_loses_unbonding() public {
        stakeAs(alice, 1_000 ether);
        bindAs(alice, NODE_A);
        vm.prank(alice);
        token.unstake(1_000 ether);
        vm.prank(orch);
        assertEq(token.slash(NODE_A, 10, carol, "e"), 0, "no active stake");
        (uint256 pending,) = token.unbonding(alice);
        assertEq(pending, 900 ether, "unbonding slashed");
    }
}
