// TensorRT plugin "MismatchPredict" (namespace "recguide", version "1"): the fused mismatch
// prediction of DESIGN.md §3.1 as an IPluginV3 layer around recguide_mismatch_predict().
//
// Inputs : 0 logits  [rows, L, V] float32 | float16
//          1 lengths [rows]       int32
// Outputs: 0 top_ids    [rows, L, 3] int32
//          1 top_probs  [rows, L, 2] float32
//          2 flag_pos   [rows]       int32
//          3 correction [rows]       int32
// Attributes: mask_token_id (int32), eos_token_id (int32), tau (float32, default 0.5).
#pragma once

#include "NvInferRuntime.h"

#include <cuda_runtime_api.h>

#include <string>
#include <vector>

extern "C" int recguide_mismatch_predict(const void* logits, int dtype, const int* lengths, int rows, int L, int V,
    int mask_id, int eos_id, float tau, int* top_ids, float* top_probs, int* flag_pos, int* correction,
    cudaStream_t stream);

namespace recguide
{

constexpr char const* kMISMATCH_PLUGIN_NAME = "MismatchPredict";
constexpr char const* kMISMATCH_PLUGIN_VERSION = "1";
constexpr char const* kMISMATCH_PLUGIN_NAMESPACE = "recguide";

class MismatchPredictPlugin : public nvinfer1::IPluginV3,
                              public nvinfer1::IPluginV3OneCore,
                              public nvinfer1::IPluginV3OneBuild,
                              public nvinfer1::IPluginV3OneRuntime
{
public:
    MismatchPredictPlugin(int32_t maskTokenId, int32_t eosTokenId, float tau);
    ~MismatchPredictPlugin() override = default;

    // IPluginV3
    nvinfer1::IPluginCapability* getCapabilityInterface(nvinfer1::PluginCapabilityType type) noexcept override;
    nvinfer1::IPluginV3* clone() noexcept override;

    // IPluginV3OneCore
    char const* getPluginName() const noexcept override;
    char const* getPluginVersion() const noexcept override;
    char const* getPluginNamespace() const noexcept override;

    // IPluginV3OneBuild
    int32_t configurePlugin(nvinfer1::DynamicPluginTensorDesc const* in, int32_t nbInputs,
        nvinfer1::DynamicPluginTensorDesc const* out, int32_t nbOutputs) noexcept override;
    int32_t getOutputDataTypes(nvinfer1::DataType* outputTypes, int32_t nbOutputs,
        nvinfer1::DataType const* inputTypes, int32_t nbInputs) const noexcept override;
    int32_t getOutputShapes(nvinfer1::DimsExprs const* inputs, int32_t nbInputs,
        nvinfer1::DimsExprs const* shapeInputs, int32_t nbShapeInputs, nvinfer1::DimsExprs* outputs,
        int32_t nbOutputs, nvinfer1::IExprBuilder& exprBuilder) noexcept override;
    bool supportsFormatCombination(int32_t pos, nvinfer1::DynamicPluginTensorDesc const* inOut, int32_t nbInputs,
        int32_t nbOutputs) noexcept override;
    int32_t getNbOutputs() const noexcept override;
    size_t getWorkspaceSize(nvinfer1::DynamicPluginTensorDesc const* inputs, int32_t nbInputs,
        nvinfer1::DynamicPluginTensorDesc const* outputs, int32_t nbOutputs) const noexcept override;

    // IPluginV3OneRuntime
    int32_t onShapeChange(nvinfer1::PluginTensorDesc const* in, int32_t nbInputs,
        nvinfer1::PluginTensorDesc const* out, int32_t nbOutputs) noexcept override;
    int32_t enqueue(nvinfer1::PluginTensorDesc const* inputDesc, nvinfer1::PluginTensorDesc const* outputDesc,
        void const* const* inputs, void* const* outputs, void* workspace, cudaStream_t stream) noexcept override;
    nvinfer1::IPluginV3* attachToContext(nvinfer1::IPluginResourceContext* context) noexcept override;
    nvinfer1::PluginFieldCollection const* getFieldsToSerialize() noexcept override;

    int32_t maskTokenId() const noexcept
    {
        return mMaskTokenId;
    }
    int32_t eosTokenId() const noexcept
    {
        return mEosTokenId;
    }
    float tau() const noexcept
    {
        return mTau;
    }

private:
    int32_t mMaskTokenId;
    int32_t mEosTokenId;
    float mTau;
    std::vector<nvinfer1::PluginField> mSerFields;
    nvinfer1::PluginFieldCollection mSerFC{};
};

class MismatchPredictPluginCreator : public nvinfer1::IPluginCreatorV3One
{
public:
    MismatchPredictPluginCreator();
    ~MismatchPredictPluginCreator() override = default;

    nvinfer1::IPluginV3* createPlugin(char const* name, nvinfer1::PluginFieldCollection const* fc,
        nvinfer1::TensorRTPhase phase) noexcept override;
    nvinfer1::PluginFieldCollection const* getFieldNames() noexcept override;
    char const* getPluginName() const noexcept override;
    char const* getPluginVersion() const noexcept override;
    char const* getPluginNamespace() const noexcept override;

private:
    std::vector<nvinfer1::PluginField> mFields;
    nvinfer1::PluginFieldCollection mFC{};
};

} // namespace recguide

// Plugin-library entry points (IPluginRegistry::loadLibrary, trtexec --dynamicPlugins, ...).
extern "C" nvinfer1::IPluginCreatorInterface* const* getCreators(int32_t& nbCreators);
extern "C" void setLoggerFinder(nvinfer1::ILoggerFinder* finder);
// Explicit registration with the global registry (for ctypes users); returns true on success.
extern "C" bool recguide_register_plugins();
