// The collectives: each checks its tensors on the caller's thread and queues one call to the
// Communicator (or, for gather, scatter and all-to-all with splits, its point-to-point calls).

#include <cstring>
#include <functional>
#include <utility>

#include <c10/util/Exception.h>

#include "internal.hpp"
#include "process_group.hpp"

namespace strata::torchbind {

c10::intrusive_ptr<c10d::Work> ProcessGroupStrata::broadcast(std::vector<at::Tensor>& tensors,
                                                             const c10d::BroadcastOptions& opts) {
  at::Tensor t = single(tensors, "broadcast");
  const DataType type = typeOf(t, "broadcast");
  checkRoot(opts.rootRank, size_, "broadcast");
  TORCH_CHECK(opts.rootTensor == 0, "strata: broadcast: rootTensor must be 0");
  const int root = static_cast<int>(opts.rootRank);
  return enqueue(c10d::OpType::BROADCAST, {t}, [this, t, type, root]() mutable {
    withContiguous(t, rank_ != root, [&](at::Tensor& c) {
      comm_->broadcast(dataOf(c), dataOf(c), countOf(c), type, root);
    });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupStrata::allreduce(std::vector<at::Tensor>& tensors,
                                                             const c10d::AllreduceOptions& opts) {
  at::Tensor t = single(tensors, "allreduce");
  const DataType type = typeOf(t, "allreduce");
  const ReduceOp op = reduceOpOf(opts.reduceOp, t, "allreduce");
  return enqueue(c10d::OpType::ALLREDUCE, {t}, [this, t, type, op]() mutable {
    withContiguous(t, true, [&](at::Tensor& c) {
      comm_->allReduce(dataOf(c), dataOf(c), countOf(c), type, op);
    });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupStrata::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  TORCH_CHECK(!tensors.empty(), "strata: allreduce_coalesced: no tensors");
  std::vector<std::pair<DataType, ReduceOp>> kinds;
  for (const auto& t : tensors) {
    kinds.emplace_back(typeOf(t, "allreduce_coalesced"),
                       reduceOpOf(opts.reduceOp, t, "allreduce_coalesced"));
  }
  return enqueue(c10d::OpType::ALLREDUCE_COALESCED, tensors, [this, tensors, kinds]() mutable {
    for (size_t i = 0; i < tensors.size(); ++i) {
      withContiguous(tensors[i], true, [&](at::Tensor& c) {
        comm_->allReduce(dataOf(c), dataOf(c), countOf(c), kinds[i].first, kinds[i].second);
      });
    }
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupStrata::reduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::ReduceOptions& opts) {
  at::Tensor t = single(tensors, "reduce");
  const DataType type = typeOf(t, "reduce");
  const ReduceOp op = reduceOpOf(opts.reduceOp, t, "reduce");
  checkRoot(opts.rootRank, size_, "reduce");
  TORCH_CHECK(opts.rootTensor == 0, "strata: reduce: rootTensor must be 0");
  const int root = static_cast<int>(opts.rootRank);
  return enqueue(c10d::OpType::REDUCE, {t}, [this, t, type, op, root]() mutable {
    // Only root's tensor changes (as with Gloo): the others reduce into a scratch copy.
    if (rank_ == root) {
      withContiguous(t, true, [&](at::Tensor& c) {
        comm_->allReduce(dataOf(c), dataOf(c), countOf(c), type, op);
      });
    } else {
      at::Tensor c = t.contiguous().clone();
      comm_->allReduce(dataOf(c), dataOf(c), countOf(c), type, op);
    }
  });
}

void ProcessGroupStrata::allGatherInto(const at::Tensor& in, DataType type,
                                       const std::function<at::Tensor&(int)>& out) {
  at::Tensor src = in.contiguous();
  const int64_t n = src.numel();
  at::Tensor flat = at::empty({static_cast<int64_t>(size_) * n}, src.options());
  comm_->allGather(dataOf(src), dataOf(flat), countOf(src), type);
  for (int r = 0; r < size_; ++r) {
    at::Tensor& o = out(r);
    o.copy_(flat.narrow(0, r * n, n).view(o.sizes()));
  }
}

c10::intrusive_ptr<c10d::Work> ProcessGroupStrata::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions&) {
  at::Tensor in = single(inputs, "allgather");
  const DataType type = typeOf(in, "allgather");
  TORCH_CHECK(outputs.size() == 1, "strata: allgather takes one output list (got ", outputs.size(),
              ")");
  std::vector<at::Tensor> outs = outputs[0];
  TORCH_CHECK(static_cast<int>(outs.size()) == size_, "strata: allgather: the output list has ",
              outs.size(), " tensors; the group has ", size_, " ranks");
  checkEachLike(outs, in, "allgather", "output");
  return enqueue(c10d::OpType::ALLGATHER, outs, [this, in, outs, type]() mutable {
    allGatherInto(in, type, [&](int r) -> at::Tensor& { return outs[static_cast<size_t>(r)]; });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupStrata::_allgather_base(at::Tensor& output,
                                                                   at::Tensor& input,
                                                                   const c10d::AllgatherOptions&) {
  const DataType type = typeOf(input, "_allgather_base");
  typeOf(output, "_allgather_base");
  checkSameType(output, input, "_allgather_base");
  TORCH_CHECK(output.numel() == static_cast<int64_t>(size_) * input.numel(),
              "strata: _allgather_base: the output has ", output.numel(),
              " elements; it needs world size (", size_, ") times the input's ", input.numel());
  at::Tensor out = output, in = input;
  return enqueue(c10d::OpType::_ALLGATHER_BASE, {out}, [this, out, in, type]() mutable {
    at::Tensor src = in.contiguous();
    withContiguous(out, true, [&](at::Tensor& c) {
      comm_->allGather(dataOf(src), dataOf(c), countOf(src), type);
    });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupStrata::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputLists, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions&) {
  TORCH_CHECK(static_cast<int>(outputLists.size()) == size_,
              "strata: allgather_coalesced: ", outputLists.size(), " output lists; the group has ",
              size_, " ranks");
  std::vector<DataType> types;
  for (const auto& in : inputs) types.push_back(typeOf(in, "allgather_coalesced"));
  std::vector<at::Tensor> flatOuts;
  for (const auto& list : outputLists) {
    TORCH_CHECK(list.size() == inputs.size(), "strata: allgather_coalesced: an output list has ",
                list.size(), " tensors, the input list ", inputs.size());
    for (size_t i = 0; i < list.size(); ++i) {
      checkSameType(list[i], inputs[i], "allgather_coalesced");
      TORCH_CHECK(list[i].numel() == inputs[i].numel(), "strata: allgather_coalesced: output ", i,
                  " has ", list[i].numel(), " elements, its input ", inputs[i].numel());
      flatOuts.push_back(list[i]);
    }
  }
  const size_t m = inputs.size();
  return enqueue(c10d::OpType::ALLGATHER_COALESCED, flatOuts,
                 [this, inputs, flatOuts, types, m]() mutable {
                   for (size_t i = 0; i < m; ++i) {
                     allGatherInto(inputs[i], types[i], [&](int r) -> at::Tensor& {
                       return flatOuts[static_cast<size_t>(r) * m + i];
                     });
                   }
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupStrata::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  at::Tensor in = single(inputs, "gather");
  const DataType type = typeOf(in, "gather");
  checkRoot(opts.rootRank, size_, "gather");
  const int root = static_cast<int>(opts.rootRank);
  std::vector<at::Tensor> outs;
  if (rank_ == root) {
    TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == size_,
                "strata: gather: the root needs one list of ", size_, " output tensors");
    outs = outputs[0];
    checkEachLike(outs, in, "gather", "output");
  } else {
    TORCH_CHECK(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()),
                "strata: gather: only the root (rank ", root, ") passes output tensors");
  }
  return enqueue(c10d::OpType::GATHER, outs, [this, in, outs, type, root]() mutable {
    at::Tensor src = in.contiguous();
    if (rank_ != root) {
      comm_->send(dataOf(src), countOf(src), type, root);
      return;
    }
    for (int r = 0; r < size_; ++r) {
      at::Tensor& o = outs[static_cast<size_t>(r)];
      if (r == root) {
        o.copy_(src.view(o.sizes()));
        continue;
      }
      withContiguous(o, true, [&](at::Tensor& c) { comm_->recv(dataOf(c), countOf(c), type, r); });
    }
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupStrata::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  at::Tensor out = single(outputs, "scatter");
  const DataType type = typeOf(out, "scatter");
  checkRoot(opts.rootRank, size_, "scatter");
  const int root = static_cast<int>(opts.rootRank);
  std::vector<at::Tensor> ins;
  if (rank_ == root) {
    TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_,
                "strata: scatter: the root needs one list of ", size_, " input tensors");
    ins = inputs[0];
    checkEachLike(ins, out, "scatter", "input");
  } else {
    TORCH_CHECK(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()),
                "strata: scatter: only the root (rank ", root, ") passes input tensors");
  }
  return enqueue(c10d::OpType::SCATTER, {out}, [this, out, ins, type, root]() mutable {
    if (rank_ != root) {
      withContiguous(out, true,
                     [&](at::Tensor& c) { comm_->recv(dataOf(c), countOf(c), type, root); });
      return;
    }
    for (int r = 0; r < size_; ++r) {
      at::Tensor src = ins[static_cast<size_t>(r)].contiguous();
      if (r == root) {
        out.copy_(src.view(out.sizes()));
      } else {
        comm_->send(dataOf(src), countOf(src), type, r);
      }
    }
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupStrata::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  at::Tensor out = single(outputs, "reduce_scatter");
  const DataType type = typeOf(out, "reduce_scatter");
  const ReduceOp op = reduceOpOf(opts.reduceOp, out, "reduce_scatter");
  TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_,
              "strata: reduce_scatter needs one list of ", size_, " input tensors");
  std::vector<at::Tensor> ins = inputs[0];
  checkEachLike(ins, out, "reduce_scatter", "input");
  return enqueue(c10d::OpType::REDUCE_SCATTER, {out}, [this, out, ins, type, op]() mutable {
    std::vector<at::Tensor> flatIns;
    for (const auto& i : ins) flatIns.push_back(i.reshape({-1}));
    at::Tensor flat = at::cat(flatIns);
    withContiguous(out, true, [&](at::Tensor& c) {
      comm_->reduceScatter(dataOf(flat), dataOf(c), countOf(c), type, op);
    });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupStrata::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  const DataType type = typeOf(output, "_reduce_scatter_base");
  typeOf(input, "_reduce_scatter_base");
  checkSameType(output, input, "_reduce_scatter_base");
  const ReduceOp op = reduceOpOf(opts.reduceOp, output, "_reduce_scatter_base");
  TORCH_CHECK(input.numel() == static_cast<int64_t>(size_) * output.numel(),
              "strata: _reduce_scatter_base: the input has ", input.numel(),
              " elements; it needs world size (", size_, ") times the output's ", output.numel());
  at::Tensor out = output, in = input;
  return enqueue(c10d::OpType::_REDUCE_SCATTER_BASE, {out}, [this, out, in, type, op]() mutable {
    at::Tensor src = in.contiguous();
    withContiguous(out, true, [&](at::Tensor& c) {
      comm_->reduceScatter(dataOf(src), dataOf(c), countOf(c), type, op);
    });
  });
}

void ProcessGroupStrata::exchange(const std::vector<const void*>& sendPtrs,
                                  const std::vector<size_t>& sendCounts,
                                  const std::vector<void*>& recvPtrs,
                                  const std::vector<size_t>& recvCounts, DataType type) {
  const size_t elem = sizeOf(type);
  for (int k = 0; k < size_; ++k) {
    const auto to = static_cast<size_t>((rank_ + k) % size_);
    const auto from = static_cast<size_t>((rank_ - k + size_) % size_);
    if (k == 0) {
      TORCH_CHECK(sendCounts[to] == recvCounts[to], "strata: alltoall: rank ", rank_, " sends ",
                  sendCounts[to], " elements to itself but expects ", recvCounts[to]);
      if (sendCounts[to] > 0) std::memmove(recvPtrs[to], sendPtrs[to], sendCounts[to] * elem);
      continue;
    }
    comm_->send(sendPtrs[to], sendCounts[to], type, static_cast<int>(to));
    comm_->recv(recvPtrs[from], recvCounts[from], type, static_cast<int>(from));
  }
}

c10::intrusive_ptr<c10d::Work> ProcessGroupStrata::alltoall_base(at::Tensor& output,
                                                                 at::Tensor& input,
                                                                 std::vector<int64_t>& outputSplits,
                                                                 std::vector<int64_t>& inputSplits,
                                                                 const c10d::AllToAllOptions&) {
  const DataType type = typeOf(input, "alltoall_base");
  typeOf(output, "alltoall_base");
  checkSameType(output, input, "alltoall_base");
  auto splits = [&](const at::Tensor& t, const std::vector<int64_t>& given, const char* side) {
    std::vector<size_t> counts(static_cast<size_t>(size_));
    const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
    const int64_t rowElems = rows == 0 ? 0 : t.numel() / rows;
    if (given.empty()) {
      TORCH_CHECK(rows % size_ == 0, "strata: alltoall_base: the ", side, " has ", rows,
                  " rows in dimension 0, not a multiple of the world size ", size_,
                  "; pass split sizes");
      for (auto& c : counts) c = static_cast<size_t>(rows / size_ * rowElems);
      return counts;
    }
    TORCH_CHECK(static_cast<int>(given.size()) == size_, "strata: alltoall_base: ", side,
                " split sizes has ", given.size(), " entries; the group has ", size_, " ranks");
    int64_t sum = 0;
    for (size_t j = 0; j < given.size(); ++j) {
      TORCH_CHECK(given[j] >= 0, "strata: alltoall_base: negative ", side, " split size");
      sum += given[j];
      counts[j] = static_cast<size_t>(given[j] * rowElems);
    }
    TORCH_CHECK(sum == rows, "strata: alltoall_base: ", side, " split sizes add up to ", sum,
                " rows; the tensor has ", rows);
    return counts;
  };
  std::vector<size_t> sendCounts = splits(input, inputSplits, "input");
  std::vector<size_t> recvCounts = splits(output, outputSplits, "output");
  at::Tensor out = output, in = input;
  const bool equal = inputSplits.empty() && outputSplits.empty();
  TORCH_CHECK(!equal || in.numel() == out.numel(), "strata: alltoall_base: input and output have ",
              in.numel(), " and ", out.numel(), " elements; without split sizes they must match");
  return enqueue(c10d::OpType::ALLTOALL_BASE, {out},
                 [this, out, in, type, equal, sendCounts, recvCounts]() mutable {
                   at::Tensor src = in.contiguous();
                   withContiguous(out, true, [&](at::Tensor& c) {
                     if (equal) {
                       comm_->allToAll(dataOf(src), dataOf(c), countOf(src) / size_, type);
                       return;
                     }
                     const size_t elem = sizeOf(type);
                     std::vector<const void*> sp;
                     std::vector<void*> rp;
                     size_t so = 0, ro = 0;
                     auto* sb = static_cast<const char*>(dataOf(src));
                     auto* rb = static_cast<char*>(dataOf(c));
                     for (int j = 0; j < size_; ++j) {
                       sp.push_back(sb ? sb + so * elem : nullptr);
                       rp.push_back(rb ? rb + ro * elem : nullptr);
                       so += sendCounts[static_cast<size_t>(j)];
                       ro += recvCounts[static_cast<size_t>(j)];
                     }
                     exchange(sp, sendCounts, rp, recvCounts, type);
                   });
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupStrata::alltoall(std::vector<at::Tensor>& outputs,
                                                            std::vector<at::Tensor>& inputs,
                                                            const c10d::AllToAllOptions&) {
  TORCH_CHECK(static_cast<int>(outputs.size()) == size_ && static_cast<int>(inputs.size()) == size_,
              "strata: alltoall needs ", size_, " input and ", size_, " output tensors (got ",
              inputs.size(), " and ", outputs.size(), ")");
  const DataType type = typeOf(inputs[0], "alltoall");
  for (int j = 0; j < size_; ++j) {
    typeOf(inputs[static_cast<size_t>(j)], "alltoall");
    typeOf(outputs[static_cast<size_t>(j)], "alltoall");
    checkSameType(inputs[static_cast<size_t>(j)], inputs[0], "alltoall");
    checkSameType(outputs[static_cast<size_t>(j)], inputs[0], "alltoall");
  }
  std::vector<at::Tensor> outs = outputs, ins = inputs;
  return enqueue(c10d::OpType::ALLTOALL, outs, [this, outs, ins, type]() mutable {
    std::vector<at::Tensor> srcs, dsts;
    std::vector<const void*> sp;
    std::vector<void*> rp;
    std::vector<size_t> sc, rc;
    for (int j = 0; j < size_; ++j) {
      srcs.push_back(ins[static_cast<size_t>(j)].contiguous());
      at::Tensor& o = outs[static_cast<size_t>(j)];
      dsts.push_back(o.is_contiguous() ? o : at::empty_like(o, at::MemoryFormat::Contiguous));
      sp.push_back(dataOf(srcs.back()));
      rp.push_back(dataOf(dsts.back()));
      sc.push_back(countOf(srcs.back()));
      rc.push_back(countOf(dsts.back()));
    }
    exchange(sp, sc, rp, rc, type);
    for (int j = 0; j < size_; ++j) {
      at::Tensor& o = outs[static_cast<size_t>(j)];
      if (!o.is_contiguous()) o.copy_(dsts[static_cast<size_t>(j)]);
    }
  });
}

}  // namespace strata::torchbind
