#pragma once

// Every kernel of the CUDA collectives module, by id, and one dispatcher over ids and element
// types that the host emulation (tests/cuda-emu) calls. The module instantiates each (id, type)
// pair as its own __global__ function (kernels.cu).

#include "kernel_common.hpp"
#include "kernel_direct.hpp"
#include "kernel_net.hpp"
#include "kernel_packets.hpp"

namespace strata::cuda {

enum class KernelId : int32_t {
  AllReduceOneShot,  ///< LL8, all pairs
  AllReduceTwoShot,  ///< LL16, reduce-scatter + all-gather of packets
  AllReduceDirect,   ///< staged reduce-scatter + all-gather, 16-byte loads
  ReduceScatterPackets,
  ReduceScatterDirect,
  AllGatherPackets,
  AllGatherDirect,
  BroadcastPackets,
  BroadcastDirect,
  AllToAllPackets,
  AllToAllDirect,
  Send,
  Recv,
  NetReduce,  ///< the network step of a cross-host reduction (kernel_net.hpp)
  NetGather,  ///< the network step of a cross-host copy
};
constexpr int kKernelIds = 15;

/// Whether the kernel reduces (and so is instantiated per element type).
constexpr bool reduces(KernelId id) {
  return id == KernelId::AllReduceOneShot || id == KernelId::AllReduceTwoShot ||
         id == KernelId::AllReduceDirect || id == KernelId::ReduceScatterPackets ||
         id == KernelId::ReduceScatterDirect || id == KernelId::NetReduce;
}
/// Whether it uses packets (and so advances the epoch).
constexpr bool usesPackets(KernelId id) {
  return id == KernelId::AllReduceOneShot || id == KernelId::AllReduceTwoShot ||
         id == KernelId::ReduceScatterPackets || id == KernelId::AllGatherPackets ||
         id == KernelId::BroadcastPackets || id == KernelId::AllToAllPackets;
}

template <KernelId Id, class T, class Ctx>
STRATA_HOST_DEVICE STRATA_DEVICE_INLINE void runKernel(Ctx& ctx, const KernelArgs& a) {
  if (a.started != nullptr && ctx.block() == 0 && ctx.thread() == 0) {
    device::storeRelease(a.started + a.call % kCallSlots, a.call);  // the monitor: it began
  }
  if constexpr (Id == KernelId::AllReduceOneShot) allReduceOneShot<T>(ctx, a);
  if constexpr (Id == KernelId::AllReduceTwoShot) allReduceTwoShot<T>(ctx, a);
  if constexpr (Id == KernelId::AllReduceDirect) allReduceDirect<T>(ctx, a);
  if constexpr (Id == KernelId::ReduceScatterPackets) reduceScatterPackets<T>(ctx, a);
  if constexpr (Id == KernelId::ReduceScatterDirect) reduceScatterDirect<T>(ctx, a);
  if constexpr (Id == KernelId::AllGatherPackets) copyPackets(ctx, CopyKind::AllGather, a);
  if constexpr (Id == KernelId::AllGatherDirect) copyDirect(ctx, CopyKind::AllGather, a);
  if constexpr (Id == KernelId::BroadcastPackets) copyPackets(ctx, CopyKind::Broadcast, a);
  if constexpr (Id == KernelId::BroadcastDirect) copyDirect(ctx, CopyKind::Broadcast, a);
  if constexpr (Id == KernelId::AllToAllPackets) copyPackets(ctx, CopyKind::AllToAll, a);
  if constexpr (Id == KernelId::AllToAllDirect) copyDirect(ctx, CopyKind::AllToAll, a);
  if constexpr (Id == KernelId::Send) sendDirect(ctx, a);
  if constexpr (Id == KernelId::Recv) recvDirect(ctx, a);
  if constexpr (Id == KernelId::NetReduce) netExchange<T>(ctx, a, true);
  if constexpr (Id == KernelId::NetGather) netExchange<T>(ctx, a, false);
}

/// Calls f.template operator()<T>() with the element type of t.
template <class F>
inline void withElemType(ElemType t, F&& f) {  // host code: dispatch
  switch (t) {
    case ElemType::Int8:
      return f.template operator()<int8_t>();
    case ElemType::Uint8:
      return f.template operator()<uint8_t>();
    case ElemType::Int32:
      return f.template operator()<int32_t>();
    case ElemType::Uint32:
      return f.template operator()<uint32_t>();
    case ElemType::Int64:
      return f.template operator()<int64_t>();
    case ElemType::Uint64:
      return f.template operator()<uint64_t>();
    case ElemType::Half:
      return f.template operator()<Half>();
    case ElemType::BFloat16:
      return f.template operator()<BFloat16>();
    case ElemType::Float:
      return f.template operator()<float>();
    case ElemType::Double:
      return f.template operator()<double>();
  }
}

/// Runtime dispatch (host emulation): kernel id and element type.
template <class Ctx>
void runKernelDynamic(KernelId id, ElemType t, Ctx& ctx, const KernelArgs& a) {
  withElemType(t, [&]<class T>() {
    switch (id) {
#define STRATA_CASE(X) \
  case KernelId::X:    \
    return runKernel<KernelId::X, T>(ctx, a);
      STRATA_CASE(AllReduceOneShot)
      STRATA_CASE(AllReduceTwoShot)
      STRATA_CASE(AllReduceDirect)
      STRATA_CASE(ReduceScatterPackets)
      STRATA_CASE(ReduceScatterDirect)
      STRATA_CASE(AllGatherPackets)
      STRATA_CASE(AllGatherDirect)
      STRATA_CASE(BroadcastPackets)
      STRATA_CASE(BroadcastDirect)
      STRATA_CASE(AllToAllPackets)
      STRATA_CASE(AllToAllDirect)
      STRATA_CASE(Send)
      STRATA_CASE(Recv)
      STRATA_CASE(NetReduce)
      STRATA_CASE(NetGather)
#undef STRATA_CASE
    }
  });
}

}  // namespace strata::cuda
