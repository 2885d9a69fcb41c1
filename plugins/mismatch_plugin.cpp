// TensorRT IPluginV3 wrapper of the fused mismatch-prediction kernel (see mismatch_plugin.h).
#include "mismatch_plugin.h"

#include <cstring>
#include <mutex>

#if defined(_WIN32)
#define RG_PLUGIN_EXPORT __declspec(dllexport)
#else
#define RG_PLUGIN_EXPORT __attribute__((visibility("default")))
#endif

using namespace nvinfer1;

namespace recguide
{
namespace
{

constexpr int32_t kNB_INPUTS = 2;
constexpr int32_t kNB_OUTPUTS = 4;
constexpr float kDEFAULT_TAU = 0.5F;

std::mutex gLoggerMutex;
ILoggerFinder* gLoggerFinder{nullptr};

void logError(char const* msg) noexcept
{
    std::lock_guard<std::mutex> lock(gLoggerMutex);
    if (gLoggerFinder != nullptr)
    {
        if (ILogger* logger = gLoggerFinder->findLogger())
        {
            logger->log(ILogger::Severity::kERROR, msg);
        }
    }
}

bool readField(PluginField const& f, int32_t& out) noexcept
{
    if (f.data == nullptr || f.length < 1)
        return false;
    switch (f.type)
    {
    case PluginFieldType::kINT32: out = *static_cast<int32_t const*>(f.data); return true;
    case PluginFieldType::kINT64: out = static_cast<int32_t>(*static_cast<int64_t const*>(f.data)); return true;
    case PluginFieldType::kINT16: out = *static_cast<int16_t const*>(f.data); return true;
    case PluginFieldType::kINT8: out = *static_cast<int8_t const*>(f.data); return true;
    default: return false;
    }
}

bool readField(PluginField const& f, float& out) noexcept
{
    if (f.data == nullptr || f.length < 1)
        return false;
    switch (f.type)
    {
    case PluginFieldType::kFLOAT32: out = *static_cast<float const*>(f.data); return true;
    case PluginFieldType::kFLOAT64: out = static_cast<float>(*static_cast<double const*>(f.data)); return true;
    default: return false;
    }
}

} // namespace

// ------------------------------------------------------------------------------------------------
// MismatchPredictPlugin
// ------------------------------------------------------------------------------------------------

MismatchPredictPlugin::MismatchPredictPlugin(int32_t maskTokenId, int32_t eosTokenId, float tau)
    : mMaskTokenId(maskTokenId)
    , mEosTokenId(eosTokenId)
    , mTau(tau)
{
}

IPluginCapability* MismatchPredictPlugin::getCapabilityInterface(PluginCapabilityType type) noexcept
{
    switch (type)
    {
    case PluginCapabilityType::kBUILD: return static_cast<IPluginV3OneBuild*>(this);
    case PluginCapabilityType::kRUNTIME: return static_cast<IPluginV3OneRuntime*>(this);
    case PluginCapabilityType::kCORE: return static_cast<IPluginV3OneCore*>(this);
    }
    return nullptr;
}

IPluginV3* MismatchPredictPlugin::clone() noexcept
{
    try
    {
        return new MismatchPredictPlugin(mMaskTokenId, mEosTokenId, mTau);
    }
    catch (...)
    {
        return nullptr;
    }
}

char const* MismatchPredictPlugin::getPluginName() const noexcept
{
    return kMISMATCH_PLUGIN_NAME;
}

char const* MismatchPredictPlugin::getPluginVersion() const noexcept
{
    return kMISMATCH_PLUGIN_VERSION;
}

char const* MismatchPredictPlugin::getPluginNamespace() const noexcept
{
    return kMISMATCH_PLUGIN_NAMESPACE;
}

int32_t MismatchPredictPlugin::configurePlugin(DynamicPluginTensorDesc const* in, int32_t nbInputs,
    DynamicPluginTensorDesc const* /*out*/, int32_t nbOutputs) noexcept
{
    if (nbInputs != kNB_INPUTS || nbOutputs != kNB_OUTPUTS)
        return -1;
    if (in[0].desc.dims.nbDims != 3 || in[1].desc.dims.nbDims != 1)
        return -1;
    return 0;
}

int32_t MismatchPredictPlugin::getOutputDataTypes(
    DataType* outputTypes, int32_t nbOutputs, DataType const* /*inputTypes*/, int32_t nbInputs) const noexcept
{
    if (nbInputs != kNB_INPUTS || nbOutputs != kNB_OUTPUTS)
        return -1;
    outputTypes[0] = DataType::kINT32;
    outputTypes[1] = DataType::kFLOAT;
    outputTypes[2] = DataType::kINT32;
    outputTypes[3] = DataType::kINT32;
    return 0;
}

int32_t MismatchPredictPlugin::getOutputShapes(DimsExprs const* inputs, int32_t nbInputs,
    DimsExprs const* /*shapeInputs*/, int32_t /*nbShapeInputs*/, DimsExprs* outputs, int32_t nbOutputs,
    IExprBuilder& exprBuilder) noexcept
{
    if (nbInputs != kNB_INPUTS || nbOutputs != kNB_OUTPUTS || inputs[0].nbDims != 3)
        return -1;
    IDimensionExpr const* rows = inputs[0].d[0];
    IDimensionExpr const* len = inputs[0].d[1];
    outputs[0].nbDims = 3;
    outputs[0].d[0] = rows;
    outputs[0].d[1] = len;
    outputs[0].d[2] = exprBuilder.constant(3);
    outputs[1].nbDims = 3;
    outputs[1].d[0] = rows;
    outputs[1].d[1] = len;
    outputs[1].d[2] = exprBuilder.constant(2);
    outputs[2].nbDims = 1;
    outputs[2].d[0] = rows;
    outputs[3].nbDims = 1;
    outputs[3].d[0] = rows;
    return 0;
}

bool MismatchPredictPlugin::supportsFormatCombination(
    int32_t pos, DynamicPluginTensorDesc const* inOut, int32_t nbInputs, int32_t nbOutputs) noexcept
{
    if (nbInputs != kNB_INPUTS || nbOutputs != kNB_OUTPUTS || pos < 0 || pos >= kNB_INPUTS + kNB_OUTPUTS)
        return false;
    PluginTensorDesc const& desc = inOut[pos].desc;
    if (desc.format != TensorFormat::kLINEAR)
        return false;
    switch (pos)
    {
    case 0: return desc.type == DataType::kFLOAT || desc.type == DataType::kHALF;
    case 1: return desc.type == DataType::kINT32;
    case 2: return desc.type == DataType::kINT32;
    case 3: return desc.type == DataType::kFLOAT;
    case 4: return desc.type == DataType::kINT32;
    case 5: return desc.type == DataType::kINT32;
    default: return false;
    }
}

int32_t MismatchPredictPlugin::getNbOutputs() const noexcept
{
    return kNB_OUTPUTS;
}

size_t MismatchPredictPlugin::getWorkspaceSize(DynamicPluginTensorDesc const* /*inputs*/, int32_t /*nbInputs*/,
    DynamicPluginTensorDesc const* /*outputs*/, int32_t /*nbOutputs*/) const noexcept
{
    return 0;
}

int32_t MismatchPredictPlugin::onShapeChange(
    PluginTensorDesc const* in, int32_t nbInputs, PluginTensorDesc const* /*out*/, int32_t nbOutputs) noexcept
{
    if (nbInputs != kNB_INPUTS || nbOutputs != kNB_OUTPUTS)
        return -1;
    if (in[0].dims.nbDims != 3 || in[1].dims.nbDims != 1 || in[1].dims.d[0] != in[0].dims.d[0])
        return -1;
    return 0;
}

int32_t MismatchPredictPlugin::enqueue(PluginTensorDesc const* inputDesc, PluginTensorDesc const* /*outputDesc*/,
    void const* const* inputs, void* const* outputs, void* /*workspace*/, cudaStream_t stream) noexcept
{
    Dims const& d = inputDesc[0].dims;
    if (d.nbDims != 3)
        return -1;
    int const dtype = inputDesc[0].type == DataType::kHALF ? 1 : 0;
    int const err = recguide_mismatch_predict(inputs[0], dtype, static_cast<int const*>(inputs[1]),
        static_cast<int>(d.d[0]), static_cast<int>(d.d[1]), static_cast<int>(d.d[2]), mMaskTokenId, mEosTokenId,
        mTau, static_cast<int*>(outputs[0]), static_cast<float*>(outputs[1]), static_cast<int*>(outputs[2]),
        static_cast<int*>(outputs[3]), stream);
    if (err != 0)
    {
        logError("MismatchPredict: recguide_mismatch_predict failed to launch");
        return -1;
    }
    return 0;
}

IPluginV3* MismatchPredictPlugin::attachToContext(IPluginResourceContext* /*context*/) noexcept
{
    return clone();
}

PluginFieldCollection const* MismatchPredictPlugin::getFieldsToSerialize() noexcept
{
    mSerFields.clear();
    mSerFields.emplace_back("mask_token_id", &mMaskTokenId, PluginFieldType::kINT32, 1);
    mSerFields.emplace_back("eos_token_id", &mEosTokenId, PluginFieldType::kINT32, 1);
    mSerFields.emplace_back("tau", &mTau, PluginFieldType::kFLOAT32, 1);
    mSerFC.nbFields = static_cast<int32_t>(mSerFields.size());
    mSerFC.fields = mSerFields.data();
    return &mSerFC;
}

// ------------------------------------------------------------------------------------------------
// MismatchPredictPluginCreator
// ------------------------------------------------------------------------------------------------

MismatchPredictPluginCreator::MismatchPredictPluginCreator()
{
    mFields.emplace_back("mask_token_id", nullptr, PluginFieldType::kINT32, 1);
    mFields.emplace_back("eos_token_id", nullptr, PluginFieldType::kINT32, 1);
    mFields.emplace_back("tau", nullptr, PluginFieldType::kFLOAT32, 1);
    mFC.nbFields = static_cast<int32_t>(mFields.size());
    mFC.fields = mFields.data();
}

IPluginV3* MismatchPredictPluginCreator::createPlugin(
    char const* /*name*/, PluginFieldCollection const* fc, TensorRTPhase /*phase*/) noexcept
{
    try
    {
        int32_t maskId = -1;
        int32_t eosId = -1;
        float tau = kDEFAULT_TAU;
        bool haveMask = false;
        bool haveEos = false;
        for (int32_t i = 0; fc != nullptr && i < fc->nbFields; ++i)
        {
            PluginField const& f = fc->fields[i];
            if (f.name == nullptr)
                continue;
            if (std::strcmp(f.name, "mask_token_id") == 0)
                haveMask = readField(f, maskId);
            else if (std::strcmp(f.name, "eos_token_id") == 0)
                haveEos = readField(f, eosId);
            else if (std::strcmp(f.name, "tau") == 0 && !readField(f, tau))
            {
                logError("MismatchPredict: attribute tau must be float32");
                return nullptr;
            }
            // other fields (e.g. plugin_version / plugin_namespace from the ONNX parser) are ignored
        }
        if (!haveMask || !haveEos)
        {
            logError("MismatchPredict: attributes mask_token_id and eos_token_id (int32) are required");
            return nullptr;
        }
        return new MismatchPredictPlugin(maskId, eosId, tau);
    }
    catch (...)
    {
        return nullptr;
    }
}

PluginFieldCollection const* MismatchPredictPluginCreator::getFieldNames() noexcept
{
    return &mFC;
}

char const* MismatchPredictPluginCreator::getPluginName() const noexcept
{
    return kMISMATCH_PLUGIN_NAME;
}

char const* MismatchPredictPluginCreator::getPluginVersion() const noexcept
{
    return kMISMATCH_PLUGIN_VERSION;
}

char const* MismatchPredictPluginCreator::getPluginNamespace() const noexcept
{
    return kMISMATCH_PLUGIN_NAMESPACE;
}

} // namespace recguide

// ------------------------------------------------------------------------------------------------
// Library entry points
// ------------------------------------------------------------------------------------------------

namespace
{
recguide::MismatchPredictPluginCreator& creatorInstance()
{
    static recguide::MismatchPredictPluginCreator sCreator;
    return sCreator;
}
} // namespace

extern "C" RG_PLUGIN_EXPORT IPluginCreatorInterface* const* getCreators(int32_t& nbCreators)
{
    static IPluginCreatorInterface* const sCreators[] = {&creatorInstance()};
    nbCreators = 1;
    return sCreators;
}

extern "C" RG_PLUGIN_EXPORT void setLoggerFinder(ILoggerFinder* finder)
{
    std::lock_guard<std::mutex> lock(recguide::gLoggerMutex);
    if (recguide::gLoggerFinder == nullptr && finder != nullptr)
        recguide::gLoggerFinder = finder;
}

extern "C" RG_PLUGIN_EXPORT bool recguide_register_plugins()
{
    IPluginRegistry* registry = getPluginRegistry();
    if (registry == nullptr)
        return false;
    char const* ns = creatorInstance().getPluginNamespace();
    // already registered (e.g. through loadLibrary) counts as success
    if (registry->getCreator(recguide::kMISMATCH_PLUGIN_NAME, recguide::kMISMATCH_PLUGIN_VERSION, ns) != nullptr)
        return true;
    return registry->registerCreator(creatorInstance(), ns);
}
